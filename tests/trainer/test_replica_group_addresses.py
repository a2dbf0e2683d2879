"""The address a replica group's torchft Manager advertises (to the Lighthouse, and to a healing
peer that fetches its state): the pod's IP the operator hands it, never the short hostname that
other pods cannot resolve; for the state's bytes, the address of faultTolerance.healNetwork's
interface when the spec names one (the loopback stands in for ib0 here), and each fetch measured."""

from __future__ import annotations

import socket
from datetime import timedelta
from pathlib import Path

import pytest

from railyard.protocol.podenv import POD_IP
from railyard.protocol.trainerconfig import ATTACHMENT_INTERFACE, FaultTolerance, HealNetwork, parse, to_wire
from railyard_trainer.config import ConfigError
from railyard_trainer.heal_address import choose_heal_host, heal_host, interface_addresses
from railyard_trainer.replicas import advertised_host, checkpoint_transport, tensor_bytes


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


# --------------------------------------------------------------------------- faultTolerance.healNetwork


def test_the_loopbacks_address_is_read_from_the_interface() -> None:
    assert (interface_addresses("lo") or [])[0] == "127.0.0.1"
    assert interface_addresses("nosuchif0") is None


def test_ipv6_addresses_follow_ipv4_global_before_host_and_never_link_local(tmp_path: Path) -> None:
    if_inet6 = tmp_path / "if_inet6"
    if_inet6.write_text(
        "00000000000000000000000000000001 01 80 10 80       lo\n"
        "fe800000000000000000000000000001 01 40 20 80       lo\n"
        "fd000000000000000000000000000007 01 40 00 80       lo\n"
        "fd000000000000000000000000000009 02 40 00 80     eth0\n"
    )
    assert interface_addresses("lo", if_inet6=if_inet6) == ["127.0.0.1", "fd00::7", "::1"]


@pytest.mark.parametrize(
    ("addresses", "host"),
    [(["10.0.0.5"], "10.0.0.5"), (["10.0.0.5", "fd00::5"], "10.0.0.5"), (["fd00::5"], "[fd00::5]"), (["::1"], "[::1]")],
)
def test_the_interfaces_first_address_is_advertised_ready_for_a_url(addresses: list[str], host: str) -> None:
    assert choose_heal_host("ib0", addresses, ["eth0", "ib0", "lo"]) == host


@pytest.mark.parametrize(
    ("addresses", "fix"),
    [(None, "this pod has no interface 'ib0' (it has eth0, lo); name one of them"), ([], "has no IP address")],
)
def test_an_interface_missing_or_without_address_names_the_field(addresses: list[str] | None, fix: str) -> None:
    with pytest.raises(ConfigError, match=r"faultTolerance\.healNetwork\.interface") as err:
        choose_heal_host("ib0", addresses, ["eth0", "lo"])
    assert fix in str(err.value)


@pytest.mark.parametrize(
    ("heal_network", "host"),
    [
        (HealNetwork(), "10.1.2.3"),  # the pod IP, as before the field existed
        (HealNetwork(interface="lo"), "127.0.0.1"),
        (HealNetwork(attachment="ib-heal"), "192.168.7.1"),  # the attachment's interface, heal0
        (HealNetwork(attachment="ib-heal", interface="lo"), "127.0.0.1"),
    ],
)
def test_the_heal_network_chooses_the_advertised_host(heal_network: HealNetwork, host: str) -> None:
    def addresses_of(name: str) -> list[str] | None:
        return {"heal0": ["192.168.7.1"]}.get(name) or interface_addresses(name)

    assert heal_host(heal_network, {POD_IP.name: "10.1.2.3"}, addresses_of=addresses_of) == host


@pytest.mark.parametrize(("interface", "fix"), [("nosuchif0", "has no interface 'nosuchif0'"), ("ib 0", "ip -brief")])
def test_a_heal_interface_the_pod_lacks_stops_the_start_naming_the_field(interface: str, fix: str) -> None:
    with pytest.raises(ConfigError, match=r"faultTolerance\.healNetwork\.interface") as err:
        heal_host(HealNetwork(interface=interface), {})
    assert fix in str(err.value)


def test_the_heal_network_travels_in_config_json() -> None:
    ft = FaultTolerance(mode="ReplicaGroups", heal_network=HealNetwork(attachment="networks/ib-heal"))
    wire = to_wire(ft)
    assert wire["healNetwork"] == {"attachment": "networks/ib-heal"}
    assert parse(FaultTolerance, wire).heal_network.interface_name == ATTACHMENT_INTERFACE


def test_a_fetch_from_a_peer_is_measured_in_bytes_and_seconds() -> None:
    pytest.importorskip("torchft")
    torch = pytest.importorskip("torch")
    timeout = timedelta(seconds=10)
    peer, healing = checkpoint_transport("127.0.0.1", timeout), checkpoint_transport("127.0.0.1", timeout)
    try:
        state = {"model": {"w": torch.ones(1000), "b": torch.zeros(10, dtype=torch.float64)}, "step": 7}
        peer.send_checkpoint(dst_ranks=[1], step=7, state_dict=state, timeout=timeout)
        assert healing.received is None
        got = healing.recv_checkpoint(src_rank=0, metadata=peer.metadata(), step=7, timeout=timeout)
        assert torch.equal(got["model"]["w"], state["model"]["w"]) and got["step"] == 7
        receipt = healing.received
        assert receipt.source == peer.address() and receipt.source.startswith("http://127.0.0.1:")
        assert receipt.bytes == 1000 * 4 + 10 * 8 == tensor_bytes(state)
        assert receipt.seconds > 0 and receipt.rate == receipt.bytes / receipt.seconds
    finally:
        peer.shutdown(wait=False)
        healing.shutdown(wait=False)
