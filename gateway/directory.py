"""The gateway's tables in the platform's PostgreSQL, shared by every gateway.

- ``gateway_users``: where each user can be reached (Telegram chat, e-mail, push
  subscription). Written by whoever onboards users (``candlewire gateway user``).
- ``gateway_acks``: the answer given for each critical event in the dedup window. Shared, so
  a resend that the container's DEALER hands to another gateway, or to this one after a
  restart, is acknowledged again and not delivered again.
- ``gateway_retries``: deliveries acknowledged QUEUED (a rate limit). Any gateway picks a due
  row under a lease (``FOR UPDATE SKIP LOCKED``), so a queued event outlives the gateway that
  queued it.

The methods are blocking; the gateway calls them from a worker thread.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
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


class Directory:
    def __init__(self, url: str) -> None:
        self.engine = sa.create_engine(url, pool_pre_ping=True, pool_size=4, max_overflow=4)

    def create(self) -> Directory:
        meta.create_all(self.engine)
        return self

    def close(self) -> None:
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

    # -- dedup -------------------------------------------------------------------------------

    def seen(self, event_id: str, window_s: float) -> ev.EventAck | None:
        with self.engine.connect() as db:
            row = db.execute(
                sa.select(acks.c.status, acks.c.error).where(
                    acks.c.event_id == event_id, acks.c.acked_at > time.time() - window_s
                )
            ).first()
        if row is None:
            return None
        return ev.EventAck(event_id=event_id, status=row.status, error_message=row.error)

    def record(self, ack: ev.EventAck, retry: Retry | None = None, due_at: float = 0.0) -> None:
        """Store an answer, and with QUEUED the retry it promises, in one transaction."""
        values = {"status": ack.status, "error": ack.error_message, "acked_at": time.time()}
        with self.engine.begin() as db:
            db.execute(
                insert(acks)
                .values(event_id=ack.event_id, **values)
                .on_conflict_do_update(index_elements=["event_id"], set_=values)
            )
            if retry is not None:
                self._schedule(db, retry, due_at)

    def purge(self, window_s: float) -> int:
        with self.engine.begin() as db:
            gone = db.execute(sa.delete(acks).where(acks.c.acked_at <= time.time() - window_s))
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

    def reschedule(self, retry: Retry, due_at: float) -> None:
        with self.engine.begin() as db:
            self._schedule(db, retry, due_at)

    def claim_due(self, lease_s: float, limit: int = 32) -> list[Retry]:
        """Take due retries for ``lease_s``: pushed into the future so no other gateway takes
        them meanwhile; if we die, they come due again when the lease ends."""
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
        return [Retry(ev.UserEvent.FromString(r.event), r.channel_index, r.attempts) for r in rows]

    def finish(self, event_id: str) -> None:
        with self.engine.begin() as db:
            db.execute(sa.delete(retries).where(retries.c.event_id == event_id))

    def queued(self) -> int:
        with self.engine.connect() as db:
            return db.execute(sa.select(sa.func.count()).select_from(retries)).scalar_one()
