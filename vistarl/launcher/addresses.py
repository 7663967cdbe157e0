"""Where `vistarl up`'s servers listen and where the other processes reach them.

A server binds `--host`. On a loopback address (`127.0.0.1`, `127.0.0.2`, `::1`, `localhost`) nothing
off this host reaches it, so each server takes a free port; on any other address (a NIC's, or `0.0.0.0`
for all of them) other hosts name the compose file's ports. Clients on this host, and the readiness
probes, dial the address the server listens on: the address itself, or loopback for a wildcard, which
listens on every address.
"""

from __future__ import annotations

import ipaddress
import socket

__all__ = ["is_loopback", "reach"]

WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1"}
"""The address that reaches a server listening on every address of this host."""


def is_loopback(host: str) -> bool:
    """Whether every address `host` (an address or a name) stands for is loopback; an unknown name is not."""
    try:
        found = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError):
        return False
    return all(ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in found)


def reach(host: str) -> str:
    """The address a process on this host dials for a server bound to `host`, as a URL writes it."""
    address = WILDCARDS.get(host, host)
    return f"[{address}]" if ":" in address else address
