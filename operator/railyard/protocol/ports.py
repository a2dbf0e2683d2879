"""A free TCP port to listen on later, outside the kernel's ephemeral range.

Asking the kernel for port 0 gives an *ephemeral* port, the same range every outgoing connection
takes its source port from. Between picking such a port and binding it for real (a launcher picks
the rendezvous port, then rank 0's store binds it seconds later, after torch has imported), any
connection on the machine can take it, and on a busy machine it does (CI saw rank 0 fail with
EADDRINUSE). A port below the ephemeral range is only ever taken by an explicit bind, so the
window closes to other programs doing the same, at one chance in thousands. The ports come from
below the range the operator hashes jobs' rendezvous and Lighthouse ports into (20000-29999,
logic/manifests/names.py; pods of the local cluster share this machine's ports), so a port picked
here never meets a gang's either. Standard library only: the launcher, the operator's demo and the
local cluster all use it.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

#: Linux's knob; its default is 32768-60999.
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: The ports we pick: above the well-known and most registered services' ports, below the
#: operator's rendezvous range (20000-29999) and the kernel's ephemeral range.
LOWEST = 10000
HIGHEST = 19999
DEFAULT_EPHEMERAL_LOW = 32768


def ephemeral_low(path: Path = EPHEMERAL_RANGE) -> int:
    """The first port of the kernel's ephemeral range (32768 where it cannot be read)."""
    try:
        low = int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_LOW
    return low if low > LOWEST + 1000 else DEFAULT_EPHEMERAL_LOW


def can_listen(port: int, host: str = "") -> bool:
    """Whether a listener could bind ``port`` on ``host`` ("" is every address, as a store binds)."""
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "", *, rng: random.Random | None = None, tries: int = 200) -> int:
    """A port nothing listens on now, below the operator's rendezvous range and the ephemeral
    range; the kernel's choice (port 0) only when none of ``tries`` random picks was free."""
    pick = rng or random.SystemRandom()
    high = min(HIGHEST, ephemeral_low() - 1)
    for _ in range(tries):
        port = pick.randint(LOWEST, high)
        if can_listen(port, host):
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
