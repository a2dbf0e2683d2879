"""The launcher's rendezvous port (and every other port we pick to listen on later) comes from
below the kernel's ephemeral range, so no outgoing connection can take it before rank 0's store
binds it (CI once saw rank 0 fail with EADDRINUSE on a port picked the old way, port 0)."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest

from railyard.logic.manifests.names import RENDEZVOUS_PORT_BASE, RENDEZVOUS_PORT_SPAN
from railyard.protocol import ports


@pytest.mark.parametrize(
    ("text", "low"),
    [("32768\t60999\n", 32768), ("40000 65000", 40000), ("", 32768), ("garbage", 32768), ("1024 65535", 32768)],
)
def test_the_ephemeral_range_is_read_from_the_kernel_knob(tmp_path: Path, text: str, low: int) -> None:
    knob = tmp_path / "ip_local_port_range"
    knob.write_text(text)
    assert ports.ephemeral_low(knob) == low
    assert ports.ephemeral_low(tmp_path / "missing") == ports.DEFAULT_EPHEMERAL_LOW


def test_a_picked_port_is_below_the_ephemeral_range_and_the_gangs_and_can_be_listened_on() -> None:
    for _ in range(20):
        port = ports.free_port()
        assert ports.LOWEST <= port < ports.ephemeral_low()
        assert port < RENDEZVOUS_PORT_BASE or port >= RENDEZVOUS_PORT_BASE + RENDEZVOUS_PORT_SPAN
        with socket.socket() as s:
            s.bind(("", port))
            s.listen()


def test_a_port_something_listens_on_is_never_picked() -> None:
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        assert not ports.can_listen(taken)

        class Always(random.Random):
            def randint(self, a: int, b: int) -> int:
                return int(taken)

        # every random pick is the busy port: the kernel's choice, which is free
        port = ports.free_port(rng=Always(), tries=5)
        assert port != taken and ports.can_listen(port)
