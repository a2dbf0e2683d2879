"""The operator tells kopf to keep no diff base (a deep copy of every event's body, ~0.5 ms of
CPU per pod event): valid only while no change-detecting handler is registered, which this
test checks, so adding one (on.create/update/field) fails here until the storage is restored."""

from __future__ import annotations

from typing import Any, cast

import kopf
from prometheus_client import CollectorRegistry

from railyard.handlers import kopf_handlers
from railyard.handlers.kopf_handlers import NoDiffBase
from railyard.handlers.runtime import OperatorSettings

KopfSettings = kopf.OperatorSettings


def test_no_change_detecting_handler_is_registered() -> None:
    registry = kopf.get_default_registry()
    assert kopf_handlers.on_event_pod is not None  # the operator's handlers are registered by now
    # kopf keeps change handlers in its registry's (private) changing registry
    changing = registry._changing.get_all_handlers()
    assert list(changing) == [], f"{changing}: restore kopf's diff base (NoDiffBase) for change handlers"
    assert registry._watching.get_all_handlers(), "the on.event handlers are there"


def test_the_storage_builds_nothing_and_remembers_nothing() -> None:
    storage = NoDiffBase()
    body = kopf.Body({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "annotations": {}}, "spec": {}})
    assert storage.build(body=body) == {}
    assert storage.fetch(body=body) is None
    patch = kopf.Patch()
    storage.store(body=body, patch=patch, essence=kopf.BodyEssence())
    assert not patch, "nothing written into the object"


async def test_the_operator_installs_it_at_startup() -> None:
    settings = KopfSettings()
    memo = kopf_handlers.build_memo(OperatorSettings(metrics_port=0, registry=CollectorRegistry()))
    kopf_handlers.runtime_of(memo).kube = cast(Any, object())  # no API server: startup only reads it
    await kopf_handlers.on_startup_operator(settings=settings, memo=memo)
    assert isinstance(settings.persistence.diffbase_storage, NoDiffBase)
