"""Hosts on one machine: a Linux network namespace per host, all on one bridge.

What the multi-host test and ``bench/scale.py`` run on. Each host has its own address on
the bridge's subnet and its own ``/etc/hosts`` (``ip netns exec`` mounts
``/etc/netns/<ns>/hosts`` over it), so a DNS name can resolve to several hosts, as a
headless service does. Needs root (CAP_NET_ADMIN) and iproute2.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

NETNS_ETC = Path("/etc/netns")


class LabError(RuntimeError):
    pass


def _ip(*args: str) -> None:
    out = subprocess.run(["ip", *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise LabError(f"ip {' '.join(args)}: {out.stderr.strip()}")


@dataclass(frozen=True)
class Host:
    name: str
    ns: str
    address: str


@dataclass
class Lab:
    """Namespaces ``{prefix}-{host}`` on bridge ``{prefix}br0``, subnet ``{subnet}.0/24``;
    the bridge (this process's side) is ``{subnet}.1``."""

    prefix: str = "cw"
    subnet: str = "10.77.0"
    hosts: dict[str, Host] = field(default_factory=dict)
    names: dict[str, list[str]] = field(default_factory=dict)
    _procs: list[subprocess.Popen] = field(default_factory=list)

    @staticmethod
    def available() -> str | None:
        """None when namespaces can be made here, else why not."""
        if os.geteuid() != 0:
            return "network namespaces need root"
        if shutil.which("ip") is None:
            return "iproute2's ip is not installed"
        return None

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br0"

    @property
    def gateway(self) -> str:
        return f"{self.subnet}.1"

    def __enter__(self) -> Lab:
        problem = self.available()
        if problem:
            raise LabError(problem)
        self.close()  # what a killed run left behind
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add(self, name: str) -> Host:
        """A host with the next address; its loopback up."""
        ns = f"{self.prefix}-{name}"
        address = f"{self.subnet}.{len(self.hosts) + 2}"
        outer, inner = f"{self.prefix}{len(self.hosts)}h", f"{self.prefix}{len(self.hosts)}n"
        _ip("netns", "add", ns)
        _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", ns)
        _ip("link", "set", outer, "master", self.bridge)
        _ip("link", "set", outer, "up")
        _ip("-n", ns, "addr", "add", f"{address}/24", "dev", inner)
        _ip("-n", ns, "link", "set", inner, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        host = self.hosts[name] = Host(name, ns, address)
        self.write_hosts()
        return host

    def name(self, dns_name: str, *hosts: str) -> None:
        """``dns_name`` resolves, on every host, to these hosts' addresses."""
        self.names[dns_name] = [self.hosts[h].address for h in hosts]
        self.write_hosts()

    def write_hosts(self) -> None:
        lines = ["127.0.0.1 localhost"]
        lines += [f"{h.address} {h.name}" for h in self.hosts.values()]
        lines += [f"{a} {n}" for n, addrs in self.names.items() for a in addrs]
        text = "\n".join(lines) + "\n"
        for h in self.hosts.values():
            folder = NETNS_ETC / h.ns
            folder.mkdir(parents=True, exist_ok=True)
            # Rewritten in place: a running process's mount of the file sees the change.
            path = folder / "hosts"
            with path.open("w") as f:
                f.write(text)

    def spawn(self, host: str, argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
        """``argv`` on ``host``, in a session of its own (kill -9 takes its children too)."""
        with log.open("ab") as out:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", self.hosts[host].ns, *argv],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._procs.append(proc)
        return proc

    def connections(self, host: str) -> list[tuple[str, str]]:
        """Established TCP connections on ``host``: (local, peer) addresses."""
        out = subprocess.run(
            ["ip", "netns", "exec", self.hosts[host].ns, "ss", "-Htn", "state", "established"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout

        def address(column: str) -> str:  # 10.0.0.2:5558, [::ffff:10.0.0.2]:5558 (IPv4-mapped)
            return column.rsplit(":", 1)[0].strip("[]").removeprefix("::ffff:")

        return [
            (address(cols[-2]), address(cols[-1]))
            for cols in map(str.split, out.splitlines())
            if len(cols) >= 4
        ]

    def stray(self, host: str) -> list[tuple[str, str]]:
        """Connections on ``host`` that leave the lab's addresses: neither both ends on the
        bridge's subnet nor both on the host's own loopback (a JVM and its py4j gateway)."""
        return [
            (local, peer)
            for local, peer in self.connections(host)
            if not (local.startswith(f"{self.subnet}.") and peer.startswith(f"{self.subnet}."))
            and not (local.startswith("127.") and peer.startswith("127."))
        ]

    def close(self) -> None:
        for proc in self._procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        self._procs.clear()
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        for line in listed.splitlines():
            ns = line.split()[0] if line.split() else ""
            if ns.startswith(f"{self.prefix}-"):
                subprocess.run(["ip", "netns", "del", ns], capture_output=True)
                shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
        # A namespace outlives its deletion while a process is still in it, and so does the
        # veth pair: remove the bridge-side ends by name.
        links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
        for line in links.splitlines():
            name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
            if (
                name.startswith(self.prefix)
                and name.endswith("h")
                and name[len(self.prefix) : -1].isdigit()
            ):
                subprocess.run(["ip", "link", "del", name], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        self.hosts.clear()
        self.names.clear()
