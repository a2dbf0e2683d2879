"""kopf's peering identity comes from the pod's name, or from nothing the passwd database must
know: the chart runs the operator as UID 65532, which has no passwd entry in the image (nor do
OpenShift's random UIDs), and kopf's own default (``getpass.getuser()``) raises for it."""

from __future__ import annotations

import getpass
import os
import pwd

import pytest

from railyard.commands.operator import peering_identity


def test_the_pod_name_is_the_identity() -> None:
    assert peering_identity({"POD_NAME": "railyard-6d9f-x2k"}) == "railyard-6d9f-x2k"
    assert peering_identity({"POD_ID": "legacy"}) == "legacy"  # kopf's own variable


def test_no_passwd_entry_and_no_user_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_entry(uid: int) -> pwd.struct_passwd:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    for var in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(KeyError):
        getpass.getuser()  # what kopf would have called
    identity = peering_identity({})
    user, _, rest = identity.partition("@")
    assert user == f"uid{os.getuid()}" and rest.count("/") == 2  # host/time/random, as kopf's own
