"""The local cluster is its own distribution (railyard-local, local_cluster/): the ``railyard``
command works without it, and the two subcommands that need it (``demo``, ``local``) say how to
install it instead of failing with a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from railyard.cli import main
from railyard.commands import INSTALL_LOCAL_CLUSTER


@pytest.fixture
def without_the_local_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if railyard-local were not installed (an entry of None makes import fail)."""
    for name in [m for m in sys.modules if m == "railyard_local" or m.startswith("railyard_local.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "railyard_local", None)


@pytest.mark.parametrize("argv", [["local", "status"], ["local", "node", "fail", "node-0"], ["demo", "--steps", "5"]])
def test_demo_and_local_name_the_install_command_when_the_local_cluster_is_missing(
    argv: list[str], without_the_local_cluster: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) != 0
    err = capsys.readouterr().err
    assert f"railyard {argv[0]}: needs the local cluster" in err and INSTALL_LOCAL_CLUSTER in err, err


def test_the_other_commands_work_without_the_local_cluster(without_the_local_cluster: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crd"]) == 0
    assert "CustomResourceDefinition" in capsys.readouterr().out


def test_building_the_command_line_does_not_import_the_local_cluster() -> None:
    """Every ``railyard`` invocation builds the whole parser: the local cluster is imported only
    when ``demo`` or ``local`` runs."""
    code = ("import sys; from railyard.cli import build_parser; build_parser().parse_args(['local', 'status']); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('railyard_local', 'kubernetes', 'cryptography')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
