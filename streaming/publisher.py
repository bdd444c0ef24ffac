"""The stream processor's ZMQ PUB, which the relay's XSUB connects to.

foreachBatch functions of different queries run on different threads; a lock serialises
their use of the one socket. Notifications are sent again after NOTIFY_REPEAT_DELAYS_S (a
subscription may still be travelling upstream the first time); market data is not.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time

import zmq
from google.protobuf.message import Message

from candlewire.config import Settings
from candlewire.topics import NOTIFY_REPEAT_DELAYS_S
from candlewire.zmqutil import harden
from proto.envelope import encode_topic


class StreamPublisher:
    def __init__(self, settings: Settings) -> None:
        self._ctx = zmq.Context()
        self._sock = harden(self._ctx.socket(zmq.PUB), max_message_bytes=settings.max_message_bytes)
        self._sock.bind(settings.bind("stream_pub"))
        for endpoint in settings.extra_relays:
            self._sock.connect(endpoint)
        self._lock = threading.Lock()
        self._due: list[tuple[float, int, str, Message]] = []
        self._seq = itertools.count()
        self._stop = threading.Event()
        self._repeater = threading.Thread(target=self._repeat, name="notify-repeat", daemon=True)
        self._repeater.start()
        self.sent = 0

    def publish(self, topic: str, msg: Message) -> None:
        frames = encode_topic(topic, msg)
        with self._lock:
            self._sock.send_multipart(frames)
            self.sent += 1

    def publish_raw(self, items: list[tuple[bytes, bytes]]) -> None:
        """(topic, record) pairs where record is already the envelope (a Kafka value)."""
        with self._lock:
            for topic, record in items:
                self._sock.send_multipart([topic, record[:1], record[1:]])
            self.sent += len(items)

    def notify(self, topic: str, msg: Message) -> None:
        self.publish(topic, msg)
        now = time.monotonic()
        with self._lock:
            for delay in NOTIFY_REPEAT_DELAYS_S[1:]:
                heapq.heappush(self._due, (now + delay, next(self._seq), topic, msg))

    def _repeat(self) -> None:
        while not self._stop.wait(0.1):
            now = time.monotonic()
            ready = []
            with self._lock:
                while self._due and self._due[0][0] <= now:
                    ready.append(heapq.heappop(self._due))
            for _, _, topic, msg in ready:
                self.publish(topic, msg)

    def close(self) -> None:
        self._stop.set()
        self._repeater.join(1)
        self._sock.close(linger=500)
        self._ctx.term()
