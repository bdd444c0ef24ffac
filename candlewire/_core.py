"""The client's protocol logic, once, for both :class:`~candlewire.Client` and
:class:`~candlewire.AsyncClient`.

Each procedure here is a generator that *yields* what it needs done on a socket (an
:data:`Op`) and is *sent* the outcome, in the sans-I/O style of h11 and wsproto: the
Lazy-Pirate retries, the wait for the SUB connection, the wait for a notification and the
market-data filter are written once, and the blocking and the asyncio client are thin
drivers that only perform the waits (:func:`drive` and :func:`async_drive`).
Creating, subscribing and closing sockets never blocks, so the core does those itself.
"""

from __future__ import annotations

import asyncio
import gc
import time
import weakref
import zlib
from collections.abc import AsyncGenerator, Callable, Generator, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from types import GeneratorType
from typing import Any, Generic, TypeVar

import pyarrow as pa
import zmq
from google.protobuf.message import Message
from zmq.utils.monitor import parse_monitor_message

from candlewire._protocol import (
    MONITOR_EVENTS,
    ConnectionState,
    FetchHead,
    HistoryCall,
    MarketFilter,
    MetadataCall,
    NotificationInbox,
    Sequence,
    Since,
    TriggerCall,
    Verdict,
    new_id,
    remaining,
    same_fetch,
    to_ms,
)
from candlewire.book import REPLAYED, RUN_MAX, DeltaRun, Replayed, delta_pieces
from candlewire.config import Settings
from candlewire.curve import dial, owned_id
from candlewire.errors import (
    CandlewireError,
    FellBehind,
    ProtocolError,
    RequestRejected,
    RequestTimeout,
    TriggerRefused,
)
from candlewire.market import Candle, Tick, _TickColumns, as_batch
from candlewire.positions import describe, is_after, run_fits, run_items, run_size
from candlewire.topics import book_type, check_id, metadata_update_topic, response_topic, tick_type
from candlewire.zmqutil import NOBLOCK, recv_frames, send_frames, take_run
from proto import cep_pb2 as cep
from proto import journal_pb2 as jr
from proto import market_pb2
from proto import requests_pb2 as rq
from proto.envelope import (
    EnvelopeError,
    checked_payload,
    decode,
    decode_body,
    encode,
    expect,
)
from proto.market_pb2 import StreamPosition

SUBMIT_TIMEOUT_S = 30.0  # the spec's REQ/REP default
TRIGGER_TIMEOUT_S = 30.0  # submit, and the stream processor's CEPTriggerAck
ATTEMPT_TIMEOUT_S = 2.5
HISTORY_TIMEOUT_S = 300.0
CONNECT_TIMEOUT_S = 5.0
RETRY_PAUSE_S = 0.2  # between retries of a NO_INGESTOR rejection
POLL_SLICE_S = 0.5  # longest single wait while a deadline runs
FILL_TIMEOUT_S = 10.0  # how long a FETCH may make no progress before FellBehind
FILL_PAUSE_S = 0.02  # before asking the journal again for what it does not hold yet
LAST_WAIT_S = 0.05  # the least a FETCH's reply is waited for, its deadline passed or not


@dataclass(frozen=True)
class Recv:
    """Wait up to ``timeout`` seconds (None: forever) for a message; outcome: frames or None."""

    sock: zmq.Socket
    timeout: float | None


@dataclass(frozen=True)
class RecvRun:
    """Wait up to ``timeout`` seconds (None: forever) for a message, then take the ones
    already queued behind it, ``limit`` in all; outcome: their frames, in order (empty:
    none came). A subscriber that fell behind reads its backlog in runs, one wait each."""

    sock: zmq.Socket
    timeout: float | None
    limit: int


@dataclass(frozen=True)
class Send:
    """Send one multipart message; outcome: None."""

    sock: zmq.Socket
    frames: list[bytes]


@dataclass(frozen=True)
class Sleep:
    seconds: float


# What a subscription's procedure hands its caller: a message, a replayed run as Arrow, a
# live run of book deltas read at once, or a book subscription's end of its replay.
Emitted = Message | pa.RecordBatch | DeltaRun | Replayed
# What a subscription's caller iterates: the generator that drives its procedure.
Emitter = Generator[Emitted, Any, None] | AsyncGenerator[Emitted, Any]


@dataclass(frozen=True)
class Emit:
    """Hand a message (or a replayed run as a RecordBatch) to the caller of an iterator
    (``subscribe``); outcome: None."""

    msg: Emitted


@dataclass(frozen=True)
class EmitMany:
    """Hand a run of messages to the caller, in order (a FETCH chunk); outcome: None."""

    msgs: list[Message]


@dataclass(frozen=True)
class Ready:
    """A subscription's socket is open and subscribed, and nothing of it has waited yet;
    outcome: None. ``drive_iter`` runs a procedure to here before it returns, and every
    deadline (the journal's, ``idle_timeout``) starts after it, at the first ``next``."""


Op = Recv | RecvRun | Send | Sleep | Emit | EmitMany | Ready
T = TypeVar("T")
S = TypeVar("S", "StartedIter", "StartedAsyncIter")
Steps = Generator[Op, Any, T]


class Run(Generic[T]):
    """One procedure being driven: the next op for the last outcome, then its result.
    Leaving the ``with`` block closes the procedure, which closes its sockets."""

    def __init__(self, steps: Steps[T]) -> None:
        self.steps = steps
        self.outcome: Any = None
        self.result: T | None = None
        self.cancelled = False  # its client closed: a reader elsewhere stops after its wait
        # The generator that emits its messages (weakly: it holds this run, and a cycle would
        # leave a dropped subscription's sockets open until a collection).
        self.emitter: weakref.ref[Emitter] | None = None

    def next(self) -> Op | None:
        try:
            return self.steps.send(self.outcome)
        except StopIteration as end:
            self.result = end.value
            return None
        except ValueError as exc:
            if self.cancelled and _executing(exc):  # its client's close, on another thread
                return None
            raise

    def __enter__(self) -> Run[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.steps.close()
        except ValueError as exc:  # its client's close, on another thread, is closing it now
            if not (self.cancelled and _executing(exc)):
                raise

    def cancel(self) -> None:
        """Its client closes: close the procedure and its sockets, and iterating ends. A
        reader on another thread, or a task awaiting it, closes them itself once its
        current wait is over (at most ``POLL_SLICE_S`` while live): a ZeroMQ socket must
        not be closed under a thread that polls it."""
        self.cancelled = True
        emitter = self.emitter() if self.emitter is not None else None
        if emitter is None:
            return  # gone, or going: its own cleanup closes the procedure, on its thread
        if not _running(emitter):
            with suppress(ValueError):  # a reader just began: the flag ends it
                self.steps.close()

    @property
    def reading(self) -> bool:
        """A reader is inside its emitting generator now (on another thread, or a task)."""
        emitter = self.emitter() if self.emitter is not None else None
        return emitter is not None and _running(emitter)


def _executing(exc: ValueError) -> bool:
    """The error of a generator entered on two threads at once, not one of its own."""
    return str(exc) == "generator already executing"


def _running(emitter: Emitter) -> bool:
    return emitter.gi_running if isinstance(emitter, GeneratorType) else emitter.ag_running


def drive(steps: Steps[T]) -> T:
    """Run a procedure to its end, blocking on each wait."""
    with Run(steps) as run:
        while (op := run.next()) is not None:
            run.outcome = perform(op)
    return run.result  # type: ignore[return-value]


class StartedIter:
    """A subscription's procedure, run to :class:`Ready` already, so its socket is
    subscribed when ``subscribe`` returns, as that docstring promises, and the subscription
    travels to the relay and upstream while the caller does something else (a plain
    generator would run nothing until the first ``next``). ``iter()`` gives the emitting
    generator itself, not this object, so a ``for`` loop pays nothing per message. Closing
    closes the procedure, and with it its sockets, whether it was iterated or not."""

    __slots__ = ("__weakref__", "_messages", "_run")

    def __init__(self, run: Run[None], messages: Generator[Emitted, Any, None]) -> None:
        self._run, self._messages = run, messages

    def __iter__(self) -> Generator[Emitted, Any, None]:
        return self._messages

    def __next__(self) -> Emitted:
        return next(self._messages)

    def close(self) -> None:
        self._messages.close()
        self._run.steps.close()  # never iterated: the generator above has no finally yet


class StartedAsyncIter:
    """:class:`StartedIter` as an async iterator."""

    __slots__ = ("__weakref__", "_messages", "_run")

    def __init__(self, run: Run[None], messages: AsyncGenerator[Emitted, Any]) -> None:
        self._run, self._messages = run, messages

    def __aiter__(self) -> AsyncGenerator[Emitted, Any]:
        return self._messages

    async def __anext__(self) -> Emitted:
        return await anext(self._messages)

    async def aclose(self) -> None:
        await self._messages.aclose()
        self._run.steps.close()


def _ready(run: Run[None]) -> None:
    """Run a subscription's procedure to :class:`Ready` (its socket subscribed)."""
    op = run.next()
    if not isinstance(op, Ready):
        run.steps.close()
        raise TypeError(f"a subscription's procedure yields Ready first, not {op!r}")


def drive_iter(steps: Steps[None]) -> StartedIter:
    """Run a procedure that emits messages (or replayed runs as RecordBatches, when asked
    for batches), as a blocking iterator; it runs to :class:`Ready` before this returns."""
    run = Run(steps)
    _ready(run)
    messages = _driven(run)
    run.emitter = weakref.ref(messages)
    return StartedIter(run, messages)


def _driven(run: Run[None]) -> Generator[Emitted, Any, None]:
    with run:
        while (op := run.next()) is not None:
            if isinstance(op, EmitMany):
                yield from op.msgs
                run.outcome = None
            elif isinstance(op, Emit):
                run.outcome = yield op.msg
            else:
                run.outcome = perform(op)
                if run.cancelled:
                    return  # its client closed: the sockets close here, on this thread


def perform(op: Op) -> Any:
    if isinstance(op, Recv):
        timeout = None if op.timeout is None else int(op.timeout * 1000)
        return recv_frames(op.sock) if op.sock.poll(timeout) else None
    if isinstance(op, RecvRun):
        timeout = None if op.timeout is None else int(op.timeout * 1000)
        return take_run(op.sock, op.limit) if op.sock.poll(timeout) else []
    if isinstance(op, Send):
        return send_frames(op.sock, op.frames)
    if isinstance(op, Sleep):
        return time.sleep(op.seconds)
    raise TypeError(f"{op!r} cannot be performed here")


async def async_drive(steps: Steps[T]) -> T:
    """Run a procedure to its end, awaiting each wait."""
    with Run(steps) as run:
        while (op := run.next()) is not None:
            run.outcome = await async_perform(op)
    return run.result  # type: ignore[return-value]


def async_drive_iter(steps: Steps[None]) -> StartedAsyncIter:
    """Run a procedure that emits messages (or replayed runs as RecordBatches), as an async
    iterator; it runs to :class:`Ready` before this returns."""
    run = Run(steps)
    _ready(run)
    messages = _async_driven(run)
    run.emitter = weakref.ref(messages)
    return StartedAsyncIter(run, messages)


async def _async_driven(run: Run[None]) -> AsyncGenerator[Emitted, Any]:
    with run:
        while (op := run.next()) is not None:
            if isinstance(op, EmitMany):
                for msg in op.msgs:
                    yield msg
                run.outcome = None
            elif isinstance(op, Emit):
                run.outcome = yield op.msg
            else:
                run.outcome = await async_perform(op)
                if run.cancelled:
                    return  # its client closed: the sockets close here, in this task


async def async_perform(op: Op) -> Any:
    # What a poll found queued is read at once through the compiled receive: the asyncio
    # socket's own receive makes a future for each message. (Its next poll checks the
    # socket's events first, so a read here takes no wake-up from it.)
    if isinstance(op, Recv):
        timeout = None if op.timeout is None else int(op.timeout * 1000)
        return recv_frames(op.sock, NOBLOCK) if await op.sock.poll(timeout) else None
    if isinstance(op, RecvRun):
        timeout = None if op.timeout is None else int(op.timeout * 1000)
        return take_run(op.sock, op.limit) if await op.sock.poll(timeout) else []
    if isinstance(op, Send):
        return await op.sock.send_multipart(op.frames)
    if isinstance(op, Sleep):
        return await asyncio.sleep(op.seconds)
    raise TypeError(f"{op!r} cannot be performed here")


class ClientCore:
    """Sockets and state of one client; procedures as generators of :data:`Op`."""

    def __init__(
        self,
        settings: Settings | None,
        client_id: str | None,
        submit_timeout: float,
        attempt_timeout: float,
        socket: Callable[[int], zmq.Socket],
    ) -> None:
        self.settings = settings or Settings()
        self.client_id = check_id(client_id or owned_id(self.settings, new_id("cl")), "client_id")
        # The subscriptions not yet closed or dropped: closing the client closes them too.
        # Their runs, not the objects subscribe() returned: a ``for`` loop over a raw one
        # keeps only its emitting generator, which keeps its run.
        self.subscriptions: weakref.WeakSet[Run[None]] = weakref.WeakSet()
        self.submit_timeout = submit_timeout
        self.attempt_timeout = attempt_timeout
        self.inbox = NotificationInbox()
        self._socket = socket
        self._state = ConnectionState()
        self._sub: zmq.Socket | None = None
        self._mon: zmq.Socket | None = None
        # Requests go to one relay, the next after one that did not answer; clients start at
        # different ones so that their requests spread.
        self._relays = self.settings.relays("client_requests")
        self._turn = zlib.crc32(self.client_id.encode()) % len(self._relays)

    # -- sockets (never block) ------------------------------------------------------------

    def open(self, kind: int, server: str = "relay") -> zmq.Socket:
        """A socket to ``server``, with this client's CURVE key when CURVE is on. A SUB takes
        no frame larger than the relay takes in (``max_message_bytes``): a peer that sent
        one is disconnected, not given the memory. The journal's replies are chunks of up
        to 50,000 messages, bounded by that count and not by a size here."""
        sock = self._socket(kind)
        if kind == zmq.SUB:
            sock.setsockopt(zmq.MAXMSGSIZE, self.settings.max_message_bytes)
        return dial(sock, self.settings, server)

    def notifications(self) -> zmq.Socket:
        """One SUB for all notifications, subscribed once to ``RESPONSE:{client_id}``."""
        if self._sub is None:
            sub = self.open(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.RECONNECT_IVL, 100)
            sub.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
            self._mon = sub.get_monitor_socket(MONITOR_EVENTS)
            sub.subscribe(response_topic(self.client_id))
            for endpoint in self.settings.relays("market_data"):
                sub.connect(endpoint)  # each relay repeats it: a dead one loses nothing
            self._sub = sub
        return self._sub

    def track(self, started: S) -> S:
        """A subscription this client closes when it closes."""
        self.subscriptions.add(started._run)
        return started

    def close(self) -> None:
        for run in list(self.subscriptions):
            run.cancel()
        if self._sub is not None:
            self._sub.disable_monitor()
            self._sub.close(linger=0)
        if self._mon is not None:
            self._mon.close(linger=0)
        self._sub = self._mon = None

    # -- history ----------------------------------------------------------------------------

    def submit(self, call: HistoryCall) -> Steps[rq.SubmitResponse]:
        """Subscribe to the notification topic first, so the notification cannot be missed;
        a submit that fails leaves neither the subscription nor the expectation behind."""
        sub = self.notifications()
        if call.topic != response_topic(self.client_id):
            sub.subscribe(call.topic)
        self.inbox.expect(call.request.request_id)
        try:
            return (yield from self.send(call))
        except BaseException:
            self._done_with(call)
            raise

    def request_history(
        self, call: HistoryCall, timeout: float
    ) -> Steps[rq.HistoryReadyNotification]:
        yield from self.submit(call)
        try:
            return (yield from self.wait_ready(call.request.request_id, timeout))
        finally:
            self._done_with(call)

    def _done_with(self, call: HistoryCall) -> None:
        """A request no one waits on any more: a HistoryReady that comes late is not kept."""
        self.inbox.forget(call.request.request_id)
        if call.request.notify == rq.NOTIFY_REQUEST and self._sub is not None:
            self._sub.unsubscribe(call.topic)

    def wait_ready(self, request_id: str, timeout: float) -> Steps[rq.HistoryReadyNotification]:
        deadline = time.monotonic() + timeout
        sub = self.notifications()
        while (note := self.inbox.take(request_id)) is None:
            if not remaining(deadline):
                raise RequestTimeout(f"no HistoryReady for {request_id} within {timeout:.0f}s")
            frames = yield Recv(sub, min(remaining(deadline), POLL_SLICE_S))
            if frames is not None:
                self.inbox.offer(frames)
        return note

    # -- requests to the relay ---------------------------------------------------------------

    def send(self, call: HistoryCall | MetadataCall | TriggerCall) -> Steps[rq.SubmitResponse]:
        """REQ with Lazy-Pirate retries; a NO_INGESTOR rejection is retried until the deadline,
        and when a retry runs out of time the caller gets that rejection, the relay's last
        word, not a timeout."""
        deadline = time.monotonic() + self.submit_timeout
        yield from self.wait_connected(min(CONNECT_TIMEOUT_S, self.submit_timeout / 2))
        rejected: RequestRejected | None = None
        while True:
            try:
                return call.accept((yield from self.lazy_pirate(call.frames(), deadline)))
            except RequestRejected as exc:
                if not exc.retryable or remaining(deadline) < RETRY_PAUSE_S:
                    raise
                rejected = exc
            except RequestTimeout as exc:
                if rejected is None:
                    raise
                raise rejected from exc
            yield Sleep(RETRY_PAUSE_S)

    def wait_connected(self, timeout: float) -> Steps[None]:
        """Until the notification SUB is connected, at most ``timeout``. Not connected yet is
        not fatal: the relay may be restarting, and the REQ retries cover it."""
        self.notifications()
        assert self._mon is not None
        deadline = time.monotonic() + timeout
        while True:
            wait = 0 if self._state.connected else remaining(deadline)
            event = yield Recv(self._mon, wait)
            if event is None:
                return
            self._state.update(parse_monitor_message(event))

    def lazy_pirate(self, frames: list[bytes], deadline: float) -> Steps[list[bytes]]:
        """Each attempt on a fresh REQ socket (the same request_id: idempotent), to the next
        relay when there are several."""
        while remaining(deadline):
            req = self.open(zmq.REQ)
            req.setsockopt(zmq.LINGER, 0)
            req.connect(self._relays[self._turn])
            try:
                yield Send(req, frames)
                reply = yield Recv(req, min(self.attempt_timeout, remaining(deadline)))
                if reply is not None:
                    return reply
            finally:
                req.close(linger=0)
            self._turn = (self._turn + 1) % len(self._relays)
            yield from self.wait_connected(0)
        relays = ", ".join(self._relays)
        raise RequestTimeout(
            f"no relay answered within {self.submit_timeout:.0f}s ({relays}): is the stack up "
            "(`candlewire status`), and are these the relays it runs?"
        )

    # -- symbol metadata -------------------------------------------------------------------

    def refresh_metadata(
        self, exchange: str, timeout: float
    ) -> Steps[market_pb2.SymbolMetadataUpdated]:
        """Like a history request: subscribe to METADATA_UPDATE first, submit, then wait for
        the SymbolMetadataUpdated that names our request_id."""
        sub = self.notifications()
        sub.subscribe(metadata_update_topic())
        call = MetadataCall.build(exchange)
        try:
            done = yield from self.submit_and_match(call, time.monotonic() + timeout)
        finally:
            sub.unsubscribe(metadata_update_topic())
        if done is None:
            raise RequestTimeout(f"no SymbolMetadataUpdated for {exchange} within {timeout:.0f}s")
        return done

    def submit_and_match(self, call: MetadataCall | TriggerCall, deadline: float) -> Steps[Any]:
        """Submit, then wait for the first notification ``call.match`` takes (the others go
        to the inbox), or None at ``deadline``."""
        sub, request_id = self.notifications(), call.request.request_id
        self.inbox.expect_answer(request_id)
        try:
            yield from self.send(call)
            while remaining(deadline):
                kept = self.inbox.take_answer(request_id)  # read by another call's wait
                done = None if kept is None else call.match(kept)
                if done is not None:
                    return done
                frames = yield Recv(sub, min(remaining(deadline), POLL_SLICE_S))
                if frames is None:
                    continue
                done = call.match(frames)
                if done is not None:
                    return done
                self.inbox.offer(frames)
            return None
        finally:
            self.inbox.forget_answer(request_id)

    # -- CEP triggers ----------------------------------------------------------------------

    def trigger(self, call: TriggerCall, timeout: float) -> Steps[cep.CEPTriggerAck]:
        """Like a metadata refresh: our topic is subscribed already, submit, then wait for
        the CEPTriggerAck that names our request_id; raise TriggerRefused on a refusal."""
        ack = yield from self.submit_and_match(call, time.monotonic() + timeout)
        if ack is None:
            raise RequestTimeout(
                f"no CEPTriggerAck for {call.request.trigger_id} in {timeout:.0f}s"
            )
        if not ack.accepted:
            raise TriggerRefused(ack)
        return ack

    def next_firing(self, timeout: float) -> Steps[cep.CEPTriggerEvent | None]:
        """The next firing of this client's triggers, each once, or None after ``timeout``."""
        deadline = time.monotonic() + timeout
        sub = self.notifications()
        while True:
            event = self.inbox.take_firing()
            if event is not None and event.client_id == self.client_id:
                return event
            if event is not None:
                continue  # another client's, whose id ours is a prefix of
            if not remaining(deadline):
                return None
            frames = yield Recv(sub, min(remaining(deadline), POLL_SLICE_S))
            if frames is not None:
                self.inbox.offer(frames)

    # -- market data ---------------------------------------------------------------------

    def subscribe(
        self,
        ticker: str,
        data_type: str,
        idle_timeout: float | None,
        since: Since,
        seq: Sequence,
        batches: bool = False,
    ) -> Steps[None]:
        """Emit every message of the topic once, in order, until closed.

        With ``since``, the journal's messages from there first, then live. A live message
        that is not the next one (by its position), or a head beacon ahead of us, starts a
        FETCH of what is missing before anything newer is emitted. SubscriptionFailed says
        why nothing will flow; ``idle_timeout`` raises RequestTimeout after that long
        without a message; FellBehind says that what is missing is held nowhere any more.
        With ``batches``, what the journal brings comes as one RecordBatch per chunk.
        """
        sub = self.open(zmq.SUB)
        journal = JournalLink(self)
        try:
            sub.setsockopt(zmq.LINGER, 0)
            filt = MarketFilter.open(sub, ticker, data_type)
            # Through every relay: each message comes once per relay, and positions drop the
            # copies, so losing a relay loses nothing and costs no failover time.
            for endpoint in self.settings.relays("market_data"):
                sub.connect(endpoint)
            yield Ready()
            if isinstance(since, Tick | Candle):
                since = since.stream  # resume right after a message received before
            if isinstance(since, StreamPosition):
                seq.last = since
            elif since is not None:
                seq.since_ms = to_ms(since, "since")
            if since is not None:
                yield from self.fill(journal, seq, None, batches)
                if data_type == book_type():
                    yield Emit(REPLAYED)  # a book unchanged since then: handed out now
            quiet_until = None if idle_timeout is None else time.monotonic() + idle_timeout
            # A book's deltas that queued up are read at once, when they follow one another
            # (DeltaRun); everything else one message at a time.
            deltas_of = filt.topic.encode() if data_type == book_type() else None
            while True:
                wait = POLL_SLICE_S if quiet_until is None else remaining(quiet_until)
                run = yield RecvRun(sub, min(wait, POLL_SLICE_S), RUN_MAX)
                if not run:
                    if quiet_until is not None and not remaining(quiet_until):
                        raise RequestTimeout(f"no {filt.topic} message in {idle_timeout}s")
                    continue
                pieces = (run,) if deltas_of is None else delta_pieces(run, deltas_of)
                for piece in pieces:
                    if isinstance(piece, DeltaRun):
                        if seq.take_run(piece.first.stream, piece.last.stream, len(piece)):
                            yield Emit(piece)
                            if idle_timeout is not None:
                                quiet_until = time.monotonic() + idle_timeout
                            continue
                        piece = piece.frames  # each then judged as it came
                    for frames in piece:
                        msg = filt.accept(frames)
                        if msg is None:
                            continue
                        if isinstance(msg, market_pb2.StreamHead):
                            behind = seq.behind(msg.last)
                            if behind and (yield from self.fill(journal, seq, msg.last, batches)):
                                seq.lost_through(msg.last)
                            continue
                        if not msg.HasField("stream"):  # type: ignore[attr-defined]
                            yield Emit(msg)  # an unsequenced publisher: nothing to check
                            continue
                        pos = msg.stream  # type: ignore[attr-defined]
                        verdict = seq.judge(pos)
                        if verdict is Verdict.GAP:
                            passed = yield from self.fill(journal, seq, pos, batches)
                            verdict = seq.judge(pos)
                            if verdict is Verdict.GAP and passed:
                                seq.lost_before(pos)  # never journalled: this one is next
                                verdict = Verdict.NEXT
                        if verdict is Verdict.NEXT:
                            seq.take(pos)
                            yield Emit(msg)
                        if idle_timeout is not None:
                            quiet_until = time.monotonic() + idle_timeout
        finally:
            journal.close()
            sub.close(linger=0)

    def fill(
        self,
        journal: JournalLink,
        seq: Sequence,
        until: StreamPosition | None,
        batches: bool = False,
    ) -> Steps[bool]:
        """FETCH chunks until ``until`` is delivered (None: the journal's end), emitting each
        message after the last one delivered; True when the journal went past ``until``
        without all of it (those it lacks were never journalled: the caller goes on). The
        next chunk is asked for from this reply's head, before its runs are read
        (:meth:`JournalLink.call`), and used once the chunk is
        taken if it is still the one to ask for: the service reads while the client parses
        and the caller works (one chunk ahead, never more). The journal is written a moment
        after the publish, so a position it does not hold yet is asked for again, for a
        while."""
        replay = seq.last is None or until is None  # a late joiner's catch-up, not a gap
        if not replay:
            seq.stats.gaps += 1
        deadline = time.monotonic() + FILL_TIMEOUT_S
        req, sent = seq.request(until, 0, new_id("f")), False
        held: list[Message] = []  # a catch-up's candles, until the next chunk is seen
        ticks = seq.topic.endswith(f"|{tick_type()}")  # as Arrow, read as columns

        def ahead(head: FetchHead) -> jr.FetchRequest | None:
            """The next FETCH as it will be once this chunk is taken whole (it ends at
            ``head.last``), asked for before the chunk is read, so the service reads the next
            while this one is parsed. Used only if it is the one the taken chunk calls for."""
            if head.status != jr.FETCH_OK or head.archived or head.last is None:
                return None
            if head.done if until is None else not is_after(until, head.last):
                return None  # the last chunk
            return seq.request(until, head.cursor, new_id("f"), after=head.last)

        try:
            while True:
                reply, columns = yield from journal.call(
                    req, deadline, sent, batches and ticks, ahead
                )
                if reply.status == jr.FETCH_OUT_OF_RANGE:
                    raise FellBehind(f"{seq.topic}: {reply.error}", seq.last)
                if reply.status == jr.FETCH_BAD_REQUEST:
                    raise ProtocolError(f"journal refused FETCH of {seq.topic}: {reply.error}")
                if reply.status != jr.FETCH_OK:
                    if not remaining(deadline):
                        raise FellBehind(
                            f"{seq.topic}: journal unavailable: {reply.error}", seq.last
                        )
                    yield Sleep(RETRY_PAUSE_S)
                    req, sent = seq.request(until, req.cursor, new_id("f")), False
                    continue
                if reply.archive_until_ms:  # from Iceberg, before the journal: no positions
                    msgs = chunk_messages(reply, seq)
                    seq.since_ms = reply.archive_until_ms
                    seq.stats.archived += len(msgs)
                    yield from hand_out(msgs, seq, batches)
                    if reply.done and until is None:  # and the journal holds nothing after
                        return False
                    if not msgs:  # a journal that holds nothing yet: not asked again at once
                        if not remaining(deadline):
                            raise FellBehind(
                                f"{seq.topic}: the journal holds nothing after the archive "
                                f"up to {describe(until)} after {FILL_TIMEOUT_S:.0f}s",
                                seq.last,
                            )
                        yield Sleep(FILL_PAUSE_S)
                    else:
                        deadline = time.monotonic() + FILL_TIMEOUT_S
                    req, sent = seq.request(until, 0, new_id("f")), False
                    continue
                if (
                    columns is not None
                    and columns.only(seq.topic)
                    and seq.accept_edges(
                        columns.first, columns.last, len(columns), filled=not replay
                    )
                ):
                    msgs = out = columns  # ticks for Arrow: read as columns, no object each
                else:
                    if columns is not None:  # overlapping what was delivered, or not all the
                        # topic's: trimmed as messages
                        try:
                            reply = journal.whole(journal.wire)
                        except EnvelopeError:  # what the columns vouched for does not decode
                            req, sent = seq.request(until, req.cursor, new_id("f")), False
                            yield Sleep(RETRY_PAUSE_S)
                            continue
                    msgs = seq.accept_chunk(chunk_messages(reply, seq), filled=not replay)
                    out = msgs
                    if replay:  # candles: the previous chunk goes out once this one is seen
                        out, held = final_revisions(held, msgs)
                finished = (until is None and reply.done) or (
                    until is not None and seq.reached(until)
                )
                passed = until is not None and not finished and reply.passed
                if finished or passed:
                    yield from hand_out(out, seq, batches)
                    yield from hand_out(held, seq, batches)
                    return passed
                if msgs or (not reply.done and reply.cursor != req.cursor):
                    # Progress: messages, or the journal's scan moved past records of other
                    # topics (a sparse topic in a busy partition comes as empty chunks).
                    deadline = time.monotonic() + FILL_TIMEOUT_S
                elif reply.done:
                    if not remaining(deadline):
                        raise FellBehind(
                            f"{seq.topic}: the journal has nothing after {describe(seq.last)} "
                            f"up to {describe(until)} after {FILL_TIMEOUT_S:.0f}s",
                            seq.last,
                        )
                    yield Sleep(FILL_PAUSE_S)  # not journalled yet
                req = seq.request(until, reply.cursor, new_id("f"))
                sent = bool(msgs)
                if sent:  # read ahead while the caller takes this chunk
                    if journal.early is not None and same_fetch(journal.early, req):
                        req = journal.early  # asked already, as the chunk was read
                    else:
                        yield Send(journal.connected(), encode(req))
                    yield from hand_out(out, seq, batches)
        except CandlewireError as exc:
            # Candles held back for the next chunk were taken already (``seq.last`` is past
            # them): out they go before the error, so that ``resume_from`` was delivered.
            yield from hand_out(held, seq, batches)
            if isinstance(exc, FellBehind) and exc.resume_from is None:
                exc.resume_from = seq.last
            raise


@contextmanager
def paused_gc() -> Iterator[None]:
    """The cyclic collector paused while a chunk's objects are made. None of them can form
    a cycle, yet the collector would run every 700 of them and scan the young generation
    each time; paused for a chunk (at most 50k messages, milliseconds), the per-message cost
    falls by about 40 % on a heap of 300k tracked objects. A caller's own pause is kept."""
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


def chunk_messages(reply: jr.FetchReply, seq: Sequence) -> list[Message]:
    """A chunk's messages as a list: one Python object each. A run that is not one of the
    subscription's topic (:func:`~candlewire.positions.run_fits`) is dropped, its messages
    counted as malformed."""
    with paused_gc():
        msgs: list[Message] = []
        for run in reply.runs:
            if run_fits(run, seq.topic):
                msgs.extend(run_items(run))
            else:
                seq.stats.malformed += run_size(run)
        return msgs


def final_revisions(
    held: list[Message], msgs: list[Message]
) -> tuple[list[Message], list[Message]]:
    """A late joiner's catch-up without the closed candles a later revision replaced (a
    trade lost upstream was fetched again, #37): it gets a window's final value, not each
    correction on the way. Candles are held back one chunk, so a revision up to a whole
    chunk later is seen wherever the chunks are cut. Returns what goes out now (the held
    chunk) and what is held next (this one); other messages are not held. Live, every
    revision is delivered as it comes."""
    if not msgs:
        return [], held
    if not isinstance(msgs[0], market_pb2.OHLC):
        return ([*held, *msgs] if held else msgs), []
    if any(m.revision for m in msgs):
        both = [*held, *msgs]
        last = {m.open_time_ms: i for i, m in enumerate(both) if m.closed}
        keep = [not m.closed or last[m.open_time_ms] == i for i, m in enumerate(both)]
        n = len(held)
        held = [m for m, k in zip(held, keep[:n], strict=True) if k]
        msgs = [m for m, k in zip(msgs, keep[n:], strict=True) if k]
    return held, msgs


def hand_out(msgs: list[Message] | _TickColumns, seq: Sequence, batches: bool) -> Steps[None]:
    """A chunk to the caller: its messages one by one, or as one RecordBatch (the rows Arrow
    cannot hold, a price that is no decimal(38,18), counted as malformed)."""
    if not msgs:
        return
    if not batches:
        yield EmitMany(msgs)  # type: ignore[arg-type] - columns only come with batches
        return
    with paused_gc():
        batch, dropped = msgs.batch() if isinstance(msgs, _TickColumns) else as_batch(msgs)
    seq.stats.malformed += dropped
    yield Emit(batch)


class JournalLink:
    """A DEALER to the journal service, replaced after a reply that did not come (Lazy
    Pirate: the request is safe to repeat, it only reads)."""

    def __init__(self, core: ClientCore) -> None:
        self.core = core
        self.sock: zmq.Socket | None = None
        self.wire = b""  # the last reply's message bytes, as received (decoded whole on demand)
        self.early: jr.FetchRequest | None = None  # the next FETCH, sent before this reply's read

    def connected(self) -> zmq.Socket:
        if self.sock is None:
            self.sock = self.core.open(zmq.DEALER, "journal")
            self.sock.setsockopt(zmq.LINGER, 0)
            self.sock.connect(self.core.settings.connect("journal"))
        return self.sock

    def call(
        self,
        req: jr.FetchRequest,
        deadline: float,
        sent: bool = False,
        columns: bool = False,
        ahead: Callable[[FetchHead], jr.FetchRequest | None] | None = None,
    ) -> Steps[tuple[jr.FetchReply, _TickColumns | None]]:
        """The reply to ``req`` (already ``sent`` ahead, or sent now). With ``columns`` (a
        replay as Arrow), a reply of ticks comes as its own fields and its ticks as columns,
        never decoded message by message; anything else comes whole, with None.

        ``ahead`` may name the next FETCH from the reply's head alone; it is sent before the
        reply is read, and kept as :attr:`early`. A reply whose id is not ``req``'s (one
        asked ahead and not used) is dropped by its head, unread."""
        self.early = None
        while True:
            sock = self.connected()
            if not sent:
                yield Send(sock, encode(req))
            sent = False
            while True:
                # Never a zero wait: a reply a moment away counts, even past the deadline.
                wait = min(self.core.attempt_timeout, max(remaining(deadline), LAST_WAIT_S))
                frames = yield Recv(sock, wait)
                if frames is None:
                    break
                head = FetchHead.read(frames)
                if head is None or head.request_id != req.request_id:
                    continue
                if ahead is not None and self.early is None:
                    self.early = ahead(head)
                    if self.early is not None:
                        yield Send(sock, encode(self.early))
                try:
                    read = None
                    if columns:  # each run's ticks counted as the payload is checked
                        payload, checked = checked_payload(frames, jr.FetchReply)
                        read = _TickColumns.read(payload, [len(r.ticks) for r in checked.runs])
                    reply, ticks = read or (expect(decode(frames), jr.FetchReply), None)
                except EnvelopeError:
                    continue
                self.wire = frames[-1]
                return reply, ticks  # type: ignore[return-value] - the columns' head
            self.close()
            self.early = None  # asked on the socket just closed: its answer is gone with it
            if not remaining(deadline):
                raise FellBehind(f"{req.topic}: the journal service did not answer")

    @staticmethod
    def whole(body: bytes) -> jr.FetchReply:
        """A reply's message, decoded whole."""
        return expect(decode_body(body), jr.FetchReply)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close(linger=0)
            self.sock = None
