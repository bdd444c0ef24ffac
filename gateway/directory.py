"""The gateway's tables in the platform's PostgreSQL, shared by every gateway.

- ``gateway_users``: where each user can be reached (Telegram chat, e-mail, push
  subscription). Written by whoever onboards users (``candlewire gateway user``).
- ``gateway_acks``: the answer given for each critical event in the dedup window. Shared, so
  a resend that the container's DEALER hands to another gateway, or to this one after a
  restart, is acknowledged again and not delivered again.
- ``gateway_claims``: which gateway is delivering an event that has no answer yet, until
  when. A resend that reaches another gateway while the first still works on it (a slow
  channel, a long queue: an ack later than the container's timeout) is left unanswered
  instead of delivered twice, and the container sends it again later. A claim that outlives
  its lease (the gateway died mid-delivery) may be taken over: at least once.
- ``gateway_retries``: deliveries acknowledged QUEUED (a rate limit). Any gateway picks a due
  row under a lease (``FOR UPDATE SKIP LOCKED``), so a queued event outlives the gateway that
  queued it.

The methods are blocking, and the gateway calls them from a worker thread, except the
critical path's: :meth:`Directory.claim`, :meth:`Directory.users` and :meth:`Directory.record`
are coroutines on the gateway's loop, each one statement for a whole batch of events, so the
events in flight share a round trip and a commit (:class:`~gateway.critical.Batcher`).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import psycopg2
import psycopg2.extensions
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import insert

from proto import events_pb2 as ev

meta = sa.MetaData()

users = sa.Table(
    "gateway_users",
    meta,
    sa.Column("user_id", sa.String(128), primary_key=True),
    sa.Column("telegram_chat_id", sa.String(64)),
    sa.Column("email", sa.String(320)),
    sa.Column("push_subscription", sa.Text),  # the browser's PushSubscription JSON
    sa.Column("updated_at", sa.Float, nullable=False),
)
acks = sa.Table(
    "gateway_acks",
    meta,
    sa.Column("event_id", sa.String(128), primary_key=True),
    sa.Column("status", sa.Integer, nullable=False),
    sa.Column("error", sa.Text, nullable=False, default=""),
    sa.Column("acked_at", sa.Float, nullable=False, index=True),
)
claims = sa.Table(
    "gateway_claims",
    meta,
    sa.Column("event_id", sa.String(128), primary_key=True),
    sa.Column("owner", sa.String(64), nullable=False),
    sa.Column("until", sa.Float, nullable=False, index=True),
)
retries = sa.Table(
    "gateway_retries",
    meta,
    sa.Column("event_id", sa.String(128), primary_key=True),
    sa.Column("event", sa.LargeBinary, nullable=False),
    sa.Column("channel_index", sa.Integer, nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("due_at", sa.Float, nullable=False, index=True),
)


@dataclass(frozen=True)
class UserAddress:
    user_id: str
    telegram_chat_id: str | None = None
    email: str | None = None
    push_subscription: dict[str, Any] | None = None


@dataclass(frozen=True)
class Retry:
    event: ev.UserEvent
    channel_index: int
    attempts: int


@dataclass(frozen=True)
class Answer:
    """The answer to one critical event, and with QUEUED the retry it promises."""

    ack: ev.EventAck
    retry: Retry | None = None
    due_at: float = 0.0


def _unnest_upsert(table: sa.Table, prefix: str) -> str:
    """INSERT a batch given as one array per column (``%(<prefix><column>)s``), or on a key
    already there overwrite the row: one statement of fixed text whatever the batch size.
    Strings go as text: a cast to varchar(n) would cut a longer one short without a word."""
    pg = postgresql.dialect()
    key, names = table.primary_key.columns[0].name, [c.name for c in table.columns]
    arrays = ", ".join(
        f"CAST(%({prefix}{c.name})s AS "
        f"{'TEXT' if isinstance(c.type, sa.String) else c.type.compile(dialect=pg)}[])"
        for c in table.columns
    )
    updates = ", ".join(f"{n} = excluded.{n}" for n in names if n != key)
    return (
        f"INSERT INTO {table.name} ({', '.join(names)}) SELECT * FROM unnest({arrays}) "
        f"ON CONFLICT ({key}) DO UPDATE SET {updates}"
    )


# The answers and the retries they promise in one statement, so atomic in autocommit: a
# data-modifying WITH runs to completion whether or not the main statement reads it.
RECORD_SQL = f"WITH queued AS ({_unnest_upsert(retries, 'r_')}) {_unnest_upsert(acks, 'a_')}"
# The earlier answers to a batch, and for the events without one a claim: inserted, or taken
# over from a lapsed lease (or from ourselves: a resend after a failed commit). One
# statement: a concurrent claim of the same event waits on the row and then loses. A claim
# stays after its answer, so a resend that read the answers just before that commit still
# finds the claim held. Rows are claimed in id order, so two gateways claiming overlapping
# batches wait on each other in one order, never in a cycle (a deadlock would fail both
# batches). Leases run on the database's clock, which every gateway shares.
DB_NOW = "CAST(extract(epoch FROM now()) AS double precision)"
CLAIM_SQL = (
    f"WITH answered AS (SELECT event_id, status, error FROM {acks.name} "
    "WHERE event_id = ANY(%(ids)s) AND acked_at > %(since)s), "
    f"claimed AS (INSERT INTO {claims.name} (event_id, owner, until) "
    f"SELECT id, %(owner)s, {DB_NOW} + %(lease_s)s FROM unnest(CAST(%(ids)s AS TEXT[])) AS id "
    "WHERE id NOT IN (SELECT event_id FROM answered) ORDER BY id "
    "ON CONFLICT (event_id) DO UPDATE SET owner = excluded.owner, until = excluded.until "
    f"WHERE {claims.name}.until < {DB_NOW} OR {claims.name}.owner = excluded.owner "
    "RETURNING event_id) "
    "SELECT event_id, status, error FROM answered UNION ALL "
    "SELECT event_id, NULL, NULL FROM claimed"
)
USERS_SQL = (
    f"SELECT user_id, telegram_chat_id, email, push_subscription FROM {users.name} "
    "WHERE user_id = ANY(%(ids)s)"
)


async def _polled(conn: Any) -> None:
    """Until an asynchronous psycopg2 connection has finished its step (connecting, or a
    statement), the running loop watching its socket."""
    loop = asyncio.get_running_loop()
    while (state := conn.poll()) != psycopg2.extensions.POLL_OK:
        fd, woke = conn.fileno(), loop.create_future()

        def wake(woke: asyncio.Future[None] = woke) -> None:
            if not woke.done():
                woke.set_result(None)

        reading = state == psycopg2.extensions.POLL_READ
        (loop.add_reader if reading else loop.add_writer)(fd, wake)
        try:
            await woke
        finally:
            (loop.remove_reader if reading else loop.remove_writer)(fd)


class Directory:
    def __init__(self, url: str) -> None:
        self.engine = sa.create_engine(url, pool_pre_ping=True, pool_size=4, max_overflow=4)
        self._idle: list[Any] = []  # the loop's connections between two batch statements

    def create(self) -> Directory:
        meta.create_all(self.engine)
        return self

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()
        self.engine.dispose()

    # -- users -------------------------------------------------------------------------------

    def set_user(
        self,
        user_id: str,
        *,
        telegram_chat_id: str | None = None,
        email: str | None = None,
        push_subscription: dict[str, Any] | None = None,
    ) -> None:
        """Create or update a user; a None field keeps its stored value."""
        values: dict[str, Any] = {"updated_at": time.time()}
        if telegram_chat_id is not None:
            values["telegram_chat_id"] = telegram_chat_id
        if email is not None:
            values["email"] = email
        if push_subscription is not None:
            values["push_subscription"] = json.dumps(push_subscription)
        stmt = insert(users).values(user_id=user_id, **values)
        with self.engine.begin() as db:
            db.execute(stmt.on_conflict_do_update(index_elements=["user_id"], set_=values))

    def user(self, user_id: str) -> UserAddress:
        """Where a user can be reached; a user not in the table has no addresses."""
        with self.engine.connect() as db:
            row = db.execute(sa.select(users).where(users.c.user_id == user_id)).first()
        if row is None:
            return UserAddress(user_id)
        push = json.loads(row.push_subscription) if row.push_subscription else None
        return UserAddress(user_id, row.telegram_chat_id, row.email, push)

    async def users(self, user_ids: list[str]) -> dict[str, UserAddress]:
        """Where each of these users can be reached, in one query."""
        rows = await self._statement(USERS_SQL, {"ids": list(set(user_ids))})
        found = {
            u: UserAddress(u, chat, email, json.loads(push) if push else None)
            for u, chat, email, push in rows
        }
        return {u: found.get(u) or UserAddress(u) for u in user_ids}

    # -- dedup -------------------------------------------------------------------------------

    async def claim(
        self, event_ids: list[str], window_s: float, owner: str, lease_s: float
    ) -> tuple[dict[str, ev.EventAck], set[str]]:
        """For a batch of events, in one statement: the answers given within the window,
        and the events now claimed by ``owner`` for ``lease_s``. An event in neither is
        another gateway's to answer."""
        params = {
            "ids": sorted(set(event_ids)),
            "since": time.time() - window_s,
            "owner": owner,
            "lease_s": lease_s,
        }
        answers: dict[str, ev.EventAck] = {}
        ours: set[str] = set()
        for e, s, m in await self._statement(CLAIM_SQL, params):
            if s is None:
                ours.add(e)
            else:
                answers[e] = ev.EventAck(event_id=e, status=s, error_message=m)
        return answers, ours

    def release(self, owner: str) -> int:
        """Give up ``owner``'s claims on events that have no answer (a gateway that stops
        with events in flight), so that their resends need not wait out the lease."""
        with self.engine.begin() as db:
            gone = db.execute(
                sa.delete(claims).where(
                    claims.c.owner == owner,
                    ~sa.exists().where(acks.c.event_id == claims.c.event_id),
                )
            )
        return gone.rowcount

    async def record(self, answers: list[Answer]) -> None:
        """Store answers, and with QUEUED the retries they promise, in one statement: one
        commit (one WAL flush) for a whole batch. The caller acks only after it returns."""
        # A row at most once a statement; a channel's reason may hold a NUL, which text may not.
        last = {a.ack.event_id: a for a in answers}.values()
        queued = [(r, a.due_at) for a in last if (r := a.retry) is not None]
        await self._statement(
            RECORD_SQL,
            {
                "a_event_id": [a.ack.event_id for a in last],
                "a_status": [a.ack.status for a in last],
                "a_error": [a.ack.error_message.replace("\x00", "") for a in last],
                "a_acked_at": [time.time()] * len(last),
                "r_event_id": [r.event.event_id for r, _ in queued],
                "r_event": [r.event.SerializeToString() for r, _ in queued],
                "r_channel_index": [r.channel_index for r, _ in queued],
                "r_attempts": [r.attempts for r, _ in queued],
                "r_due_at": [due for _, due in queued],
            },
        )

    async def _statement(self, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        """One statement of the critical path, on the running loop: a psycopg2 connection in
        asynchronous mode (autocommit), kept from the last batch. Through SQLAlchemy and a
        worker thread a statement cost about ten times its round trip in CPU (a checkout
        ping, a transaction, two thread hand-offs). A kept connection may have died since;
        then the statement runs once more on a fresh one, as each of them may (reads, and
        an upsert)."""
        for attempt in range(2):
            kept = self._idle.pop() if attempt == 0 and self._idle else None
            conn = kept if kept is not None else await self._connect()
            try:
                cur = conn.cursor()
                cur.execute(sql, params)
                await _polled(conn)
                rows = cur.fetchall() if cur.description else []
            except BaseException as exc:
                conn.close()
                if kept is not None and isinstance(
                    exc, psycopg2.OperationalError | psycopg2.InterfaceError
                ):
                    continue
                raise
            self._idle.append(conn)
            return rows
        raise AssertionError("unreachable")

    async def _connect(self) -> Any:
        dialect = self.engine.dialect
        if dialect.driver != "psycopg2":
            raise ValueError(f"the gateway's directory needs psycopg2, not {dialect.driver}")
        args, kwargs = dialect.create_connect_args(self.engine.url)
        conn = psycopg2.connect(*args, **kwargs, async_=True)
        try:
            await _polled(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def purge(self, window_s: float) -> int:
        """Forget answers older than the window, and claims that lapsed as long ago."""
        cutoff = time.time() - window_s
        with self.engine.begin() as db:
            gone = db.execute(sa.delete(acks).where(acks.c.acked_at <= cutoff))
            db_now = sa.literal_column(DB_NOW, sa.Float)
            db.execute(sa.delete(claims).where(claims.c.until + window_s <= db_now))
        return gone.rowcount

    # -- queued deliveries -------------------------------------------------------------------

    @staticmethod
    def _schedule(db: sa.Connection, retry: Retry, due_at: float) -> None:
        values = {
            "event": retry.event.SerializeToString(),
            "channel_index": retry.channel_index,
            "attempts": retry.attempts,
            "due_at": due_at,
        }
        db.execute(
            insert(retries)
            .values(event_id=retry.event.event_id, **values)
            .on_conflict_do_update(index_elements=["event_id"], set_=values)
        )

    def claim_due(self, lease_s: float, limit: int = 32) -> tuple[list[Retry], float]:
        """Take due retries until the time returned (``lease_s`` from now): pushed to it, so
        no other gateway takes them meanwhile; if we die, they come due again then."""
        now = time.time()
        with self.engine.begin() as db:
            rows = db.execute(
                sa.select(retries)
                .where(retries.c.due_at <= now)
                .order_by(retries.c.due_at)
                .limit(limit)
                .with_for_update(skip_locked=True)
            ).all()
            if rows:
                db.execute(
                    sa.update(retries)
                    .where(retries.c.event_id.in_([r.event_id for r in rows]))
                    .values(due_at=now + lease_s)
                )
        due = [Retry(ev.UserEvent.FromString(r.event), r.channel_index, r.attempts) for r in rows]
        return due, now + lease_s

    def settle_retry(
        self, event_id: str, until: float, retry: Retry | None, due_at: float = 0.0
    ) -> bool:
        """A claimed retry's outcome: queued again (``retry``, due at ``due_at``) or done
        (None). Only while the claim made ``until`` holds: past it another gateway may have
        taken the row, and its outcome stands, not one written over it from here."""
        ours = (retries.c.event_id == event_id) & (retries.c.due_at == until)
        with self.engine.begin() as db:
            if retry is None:
                done = db.execute(sa.delete(retries).where(ours))
            else:
                again = {
                    "event": retry.event.SerializeToString(),
                    "channel_index": retry.channel_index,
                    "attempts": retry.attempts,
                    "due_at": due_at,
                }
                done = db.execute(sa.update(retries).where(ours).values(**again))
        return done.rowcount == 1

    def queued(self) -> int:
        with self.engine.connect() as db:
            return db.execute(sa.select(sa.func.count()).select_from(retries)).scalar_one()
