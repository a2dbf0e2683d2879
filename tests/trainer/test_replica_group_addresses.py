"""The address a replica group's torchft Manager advertises (to the Lighthouse, and to a healing
peer that fetches its state): the pod's IP the operator hands it, never the short hostname that
other pods cannot resolve."""

from __future__ import annotations

import socket
from datetime import timedelta

import pytest

from railyard.protocol.podenv import POD_IP
from railyard_trainer.config import ConfigError
from railyard_trainer.replicas import advertised_host, checkpoint_transport


@pytest.mark.parametrize(
    ("pod_ip", "host"),
    [("10.1.2.3", "10.1.2.3"), (" 10.1.2.3\n", "10.1.2.3"), ("fd00::1:2", "[fd00::1:2]"), ("FD00:0::5", "[fd00::5]")],
)
def test_the_pod_ip_is_advertised_ready_for_a_url(pod_ip: str, host: str) -> None:
    assert advertised_host({POD_IP.name: pod_ip}) == host


def test_without_a_pod_ip_torchfts_own_choice_stays() -> None:
    assert advertised_host({}) == socket.gethostname()
    assert advertised_host({POD_IP.name: ""}) == socket.gethostname()


def test_a_pod_ip_that_is_no_address_names_the_variable() -> None:
    with pytest.raises(ConfigError, match=POD_IP.name):
        advertised_host({POD_IP.name: "llm-0"})


def test_the_checkpoint_transport_serves_at_the_advertised_host() -> None:
    pytest.importorskip("torchft")
    transport = checkpoint_transport("[fd00::7]", timedelta(seconds=5))
    try:
        address = transport.address()
        port = transport._server.socket.getsockname()[1]
        assert address == f"http://[fd00::7]:{port}/checkpoint/"
    finally:
        transport.shutdown(wait=False)
