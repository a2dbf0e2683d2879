"""The address a replica group advertises for healing (``faultTolerance.healNetwork``).

A restarted group fetches a live peer's parameters and optimizer state from the address the
peer's torchft checkpoint transport advertises (plain HTTP; the server listens on every
interface). torchft advertises the hostname, which other pods cannot resolve; we advertise the pod
IP (:func:`railyard_trainer.replicas.advertised_host`), so by default a heal crosses the pod
network. On a cluster with a separate data network (InfiniBand with IPoIB, a second Ethernet
fabric attached by Multus) the spec names that network's interface, and the group advertises its
address instead: the bytes then cross the fast network (docs/fault-tolerance.md, "Heals").

The interface is resolved once, when the group starts; a pod without it stops with an error that
names the field, instead of advertising an address no peer can reach.
"""

from __future__ import annotations

import errno
import fcntl
import ipaddress
import socket
import struct
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from railyard.protocol.trainerconfig import HealNetwork, interface_name_problem
from railyard_trainer.config import ConfigError
from railyard_trainer.replicas import advertised_host

#: Linux's ioctl for an interface's (primary) IPv4 address.
_SIOCGIFADDR = 0x8915
#: /proc/net/if_inet6's scopes we can advertise: global, and host (the loopback's ``::1``);
#: a link-local address needs a zone id that an URL cannot carry to another pod.
_IPV6_SCOPES = {"00": 0, "10": 1}
_FIELD = "faultTolerance.healNetwork.interface"


def interface_addresses(name: str, *, if_inet6: Path = Path("/proc/net/if_inet6")) -> list[str] | None:
    """The IP addresses of this machine's interface ``name``, IPv4 first, then IPv6 (global
    before host scope); ``[]``: the interface has none; None: there is no such interface."""
    if name not in {n for _, n in socket.if_nameindex()} and ":" not in name:  # eth0:1 is an alias, not listed
        return None
    found: list[str] = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            reply = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            found.append(socket.inet_ntoa(reply[20:24]))
        except OSError as exc:
            if exc.errno == errno.ENODEV:
                return None
            if exc.errno != errno.EADDRNOTAVAIL:
                raise
    v6: list[tuple[int, str]] = []
    try:
        lines = if_inet6.read_text().splitlines()
    except OSError:  # no IPv6 in this kernel
        lines = []
    for line in lines:
        parts = line.split()
        if len(parts) == 6 and parts[5] == name and parts[3] in _IPV6_SCOPES:
            v6.append((_IPV6_SCOPES[parts[3]], str(ipaddress.IPv6Address(bytes.fromhex(parts[0])))))
    return found + [a for _, a in sorted(v6)]


def choose_heal_host(interface: str, addresses: Sequence[str] | None, present: Sequence[str]) -> str:
    """The host part of the advertised URL for ``interface`` with these ``addresses`` (from
    :func:`interface_addresses`): its first address, an IPv6 one in brackets. ``present``: the
    pod's interfaces, named in the error when ``interface`` is not one of them."""
    if addresses is None:
        raise ConfigError([
            f"{_FIELD}: this pod has no interface {interface!r} (it has {', '.join(present) or 'none'}); name one of "
            "them, attach the network (faultTolerance.healNetwork.attachment), or remove the field to heal over the "
            "pod network"
        ])
    if not addresses:
        raise ConfigError([
            f"{_FIELD}: interface {interface!r} has no IP address a peer could fetch from; give it one (the heal "
            "transport is HTTP over TCP: on InfiniBand, IPoIB) or name another interface"
        ])
    addr = ipaddress.ip_address(addresses[0])
    return f"[{addr}]" if addr.version == 6 else str(addr)


def heal_host(heal_network: HealNetwork, env: Mapping[str, str] | None = None, *,
              addresses_of: Callable[[str], list[str] | None] = interface_addresses) -> str:
    """The host this group's checkpoint transport advertises: ``heal_network``'s interface's
    address, or the pod IP when it names none (as before the field existed)."""
    name = heal_network.interface_name
    if name is None:
        return advertised_host(env)
    if (problem := interface_name_problem(name)) is not None:
        raise ConfigError([f"{_FIELD}: {problem}"])
    return choose_heal_host(name, addresses_of(name), sorted(n for _, n in socket.if_nameindex()))
