"""What an authenticated peer may do at the relay (CURVE on; :mod:`candlewire.curve`).

Which channels a role may use at all is ZAP's decision; this is the finer one, per message:
- a client hears only its own notifications: ``RESPONSE:{key}.…``, ``HISTORY_READY:{key}.…``
  and ``USER:{user}``; market data is open to every admitted peer;
- a client's requests carry client ids under its key name, so nobody can have answers sent to
  another's topic (nor a request id notified by its own topic outside that name, where it
  could not hear the answer); a client key held to a user registers triggers for that user
  alone;
- only ingestors steer ingestors (IngestorControl, real-time DataRequests) and only their
  heartbeats may they publish into the fanout.
"""

from __future__ import annotations

from collections import Counter

from google.protobuf.message import Message

from candlewire.curve import Peer
from candlewire.topics import history_ready_topic, ingestor_topic, response_topic, user_topic
from proto import cep_pb2 as cep
from proto import requests_pb2 as rq

_PRIVATE = (response_topic(""), history_ready_topic(""), user_topic(""))
_STEERING = (rq.REALTIME_SUBSCRIBE, rq.REALTIME_CANCEL)


def may_subscribe(peer: Peer | None, topic: str) -> bool:
    """Whether ``peer`` may subscribe to the prefix ``topic`` on the market-data XPUB."""
    if peer is None or peer.role != "client":
        return peer is not None  # services are trusted; None is a peer CURVE never admitted
    own = (response_topic(f"{peer.name}."), history_ready_topic(f"{peer.name}."))
    if topic.startswith(own) or (peer.user and topic == user_topic(peer.user)):
        return True
    # A prefix of a private namespace ("", "RES", "USER:") would match everyone's.
    return not any(topic.startswith(p) or p.startswith(topic) for p in _PRIVATE)


def may_publish(peer: Peer | None, topic: bytes) -> bool:
    """Whether what ``peer`` sent into the fanout goes on (None: the relay's own inproc)."""
    if peer is None or peer.role == "publisher":
        return True
    return peer.role == "ingestor" and topic.startswith(ingestor_topic("").encode())


def may_request(peer: Peer | None, msg: Message) -> str | None:
    """Why ``peer`` may not send ``msg`` to the relay's ROUTER, or None when it may."""
    if peer is None:
        return None  # CURVE off
    if isinstance(msg, rq.IngestorControl) or (
        isinstance(msg, rq.DataRequest) and msg.kind in _STEERING
    ):
        return None if peer.role == "ingestor" else f"a {peer.role} key cannot steer ingestors"
    if peer.role != "client":
        return None
    owned = isinstance(msg, rq.SubmitHistoricalRequest | cep.CEPTriggerRequest)
    if owned and not msg.client_id.startswith(f"{peer.name}."):
        return f"client_id {msg.client_id!r} is not under this key's name ({peer.name}.…)"
    # Its HistoryReady comes on HISTORY_READY:{request_id}, which this key may hear only
    # under its name: accepted, the request would be answered to nobody.
    by_request = isinstance(msg, rq.SubmitHistoricalRequest) and msg.notify == rq.NOTIFY_REQUEST
    if by_request and not msg.request_id.startswith(f"{peer.name}."):
        return (
            f"request_id {msg.request_id!r} is not under this key's name ({peer.name}.…), "
            "where its HistoryReady would come"
        )
    # A key held to a user addresses alerts to that user alone (a key without one is the
    # operator's, as ``local`` is): another's Telegram or e-mail is not its to fill.
    if isinstance(msg, cep.CEPTriggerRequest) and peer.user and msg.user_id not in ("", peer.user):
        return f"user_id {msg.user_id!r} is not this key's user ({peer.user})"
    return None


class Upstream:
    """The relay's own count of who holds which subscription, since an XPUB in manual mode
    hands over every (un)subscription, duplicates and strangers' included.

    A topic goes upstream on its first holder and leaves on its last. An explicit
    unsubscription counts only for a key that holds the topic; one libzmq makes for a
    closed connection carries no key, and first takes back a refused subscription of the
    same topic (holding a subscription too long is better than ending one that is used).
    """

    def __init__(self) -> None:
        self.total: Counter[str] = Counter()
        self.held: Counter[tuple[str, str]] = Counter()
        self.refused: Counter[str] = Counter()

    def subscribe(self, peer: Peer | None, topic: str) -> bool:
        """True when the topic must now go upstream."""
        self.total[topic] += 1
        if peer is not None:
            self.held[(peer.user_id(), topic)] += 1
        return self.total[topic] == 1

    def refuse(self, topic: str) -> None:
        self.refused[topic] += 1

    def unsubscribe(self, peer: Peer | None, topic: str) -> bool:
        """True when the topic must now leave upstream."""
        if peer is not None:
            key = (peer.user_id(), topic)
            if self.held[key] <= 0:
                self._take(self.refused, topic)
                return False
            self._take(self.held, key)
        elif self.refused[topic] > 0:
            self._take(self.refused, topic)
            return False
        if self.total[topic] <= 0:
            return False
        self._take(self.total, topic)
        return topic not in self.total

    @staticmethod
    def _take(counter: Counter, key: object) -> None:
        counter[key] -= 1
        if counter[key] <= 0:
            del counter[key]
