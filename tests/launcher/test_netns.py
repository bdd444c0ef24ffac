"""Several hosts on network namespaces (:mod:`launcher.netns`): a Kafka broker, two relays,
two stream publishers the relays find by one DNS name, and a client given both relays.
``kill -9`` of a relay under the client loses no tick and no history request, and every
connection stays on the hosts' own addresses. Root only (CI runs as root)."""

from __future__ import annotations

import urllib.request

import pytest

from bench.scale import failover, start_hosts
from candlewire.config import Settings
from launcher.netns import Lab

pytestmark = pytest.mark.skipif(Lab.available() is not None, reason=str(Lab.available()))
SUBNET = "10.78.0"
HISTORY = 10


def discovered(address: str) -> float:
    url = f"http://{address}:{Settings().port('relay_metrics')}/metrics"
    body = urllib.request.urlopen(url, timeout=5).read().decode()
    (line,) = [x for x in body.splitlines() if x.startswith("candlewire_relay_discovered_pub")]
    return float(line.split()[-1])


def test_two_relays_and_two_publishers_on_hosts_of_their_own(tmp_path) -> None:
    with Lab(prefix="cwt", subnet=SUBNET) as lab:
        relays = start_hosts(lab, tmp_path, rate=2000)
        for relay in ("relay-a", "relay-b"):  # both publishers' two ports, by DNS
            assert discovered(lab.hosts[relay].address) == 4
        got = failover(lab, tmp_path, relays, HISTORY)
        assert got["histories_done"] == HISTORY, got["histories"]
        assert got["ticks"] > 0 and got["missing"] == 0 and got["repeated"] == 0, got
        assert got["failover_s"] is not None and got["failover_s"] < 2.0, got
        for host in ("relay-b", "pub-a", "client", "kafka"):
            for local, peer in lab.connections(host):
                assert local.startswith(f"{SUBNET}.") and peer.startswith(f"{SUBNET}."), (
                    host,
                    local,
                    peer,
                )
