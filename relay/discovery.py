"""Stream publishers found by DNS: one name that resolves to every publisher.

The spec's headless service: a name (Kubernetes headless service, Consul, round-robin A
records) whose addresses are the stream publishers now running. The relay re-resolves it
every ``discovery_interval_s``, connects its XSUB to addresses that appeared and
disconnects from those that went. A lookup that fails keeps the last addresses: a DNS hiccup
must not cut every publisher off.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

log = logging.getLogger("candlewire.relay.discovery")

Resolver = Callable[[str], list[str]]
"""A host name -> its addresses now (IPv4 dotted or IPv6 text)."""


def resolve(host: str) -> list[str]:
    """Every address the system resolver gives for ``host`` (hosts file, DNS...)."""
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


def endpoint(address: str, port: int) -> str:
    """A ZMQ tcp endpoint; IPv6 addresses go in brackets."""
    return f"tcp://[{address}]:{port}" if ":" in address else f"tcp://{address}:{port}"


def parse_name(entry: str, default_ports: Iterable[int]) -> tuple[str, tuple[int, ...]]:
    """``host`` (the publisher's standard ports) or ``host:port``; IPv6 as ``[addr]:port``."""
    host, sep, port = entry.rpartition(":")
    if not sep or (entry.count(":") > 1 and not entry.startswith("[")):
        return entry, tuple(default_ports)  # a name, or a bare IPv6 address
    host = host.removeprefix("[").removesuffix("]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"publisher name {entry!r} is not host or host:port")
    return host, (int(port),)


@dataclass
class Discovery:
    """The endpoints the names resolve to, and what changed since the last look."""

    names: list[tuple[str, tuple[int, ...]]]
    resolver: Resolver = resolve
    current: set[str] = field(default_factory=set)
    failures: int = 0
    _known: dict[str, set[str]] = field(default_factory=dict)

    def refresh(self) -> tuple[set[str], set[str]]:
        """Resolve every name; (endpoints to connect, endpoints to disconnect)."""
        for host, ports in self.names:
            try:
                addresses = self.resolver(host)
            except OSError as exc:  # socket.gaierror included
                self.failures += 1
                log.warning(
                    "cannot resolve publisher name %s (%s); keeping its last addresses", host, exc
                )
                continue
            self._known[host] = {endpoint(a, p) for a in addresses for p in ports}
        wanted = set().union(*self._known.values()) if self._known else set()
        added, removed = wanted - self.current, self.current - wanted
        self.current = wanted
        return added, removed
