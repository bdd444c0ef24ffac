"""CURVE keys, and which role may use which channel: one place for every ZeroMQ peer.

With ``[security] curve = true`` every TCP channel is encrypted and each peer proves a key
that the allow-list (``keys/allowed.json`` in the state dir) names with a role. The side
that *receives* what matters is the CURVE server, whether it binds or dials: the relay for
everything it takes in (its XSUB too, which dials the stream publishers), the gateway for
user events (its SUB dials the containers), the journal for fetches. So a publisher is
always a client holding a ``publisher`` key, and a key that leaks lets its holder do only
what its role may.

Authentication is pyzmq's own ZAP authenticator (:mod:`zmq.auth`); each server socket names
its channel as the ZAP domain, and the channel's roles decide. The ZAP User-Id of an
accepted peer is ``role/name/user``, so a service can tell on every message who sent it
(:func:`peer_of`).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from candlewire.config import Settings
from candlewire.endpoints import ENDPOINTS

log = logging.getLogger("candlewire.curve")

ROLES = ("client", "ingestor", "publisher", "container", "gateway")

# The roles each channel admits; the channel is the server socket's ZAP domain.
CHANNELS: dict[str, frozenset[str]] = {
    # relay
    "requests": frozenset({"client", "ingestor", "gateway"}),
    "work": frozenset({"ingestor"}),
    "control": frozenset({"ingestor"}),
    "market": frozenset({"client", "ingestor", "gateway"}),
    "ingress": frozenset({"publisher", "ingestor"}),
    # gateway
    "critical": frozenset({"container", "publisher"}),
    "events": frozenset({"container", "publisher"}),
    # journal service
    "journal": frozenset({"client", "gateway"}),
}

# Server key pairs, one per service that authenticates peers.
SERVERS = ("relay", "gateway", "journal")

# Each channel's server and endpoint. A peer dials them all but ``events``: there the
# gateway's SUB dials the peer's own XPUB, bound on that port.
CHANNEL_ENDPOINTS: dict[str, tuple[str, str]] = {
    "requests": ("relay", "client_requests"),
    "work": ("relay", "work_queue"),
    "control": ("relay", "control"),
    "market": ("relay", "market_data"),
    "ingress": ("relay", "publisher_ingress"),
    "critical": ("gateway", "critical_events"),
    "events": ("gateway", "user_events"),
    "journal": ("journal", "journal"),
}
EXPORT_FORMAT = "candlewire-key/1"

# The client keys of candlewire's own processes, made by ``keys init``. ``desk`` is the stream
# job's trigger desk, which takes work from the work queue as ingestors do; ``local`` is
# what the CLI and the client library use unless ``[security] key`` names another.
INGESTOR_KEY, PUBLISHER_KEY, DESK_KEY, GATEWAY_KEY = "ingest", "stream", "desk", "gateway"
SERVICE_KEYS: dict[str, str] = {
    INGESTOR_KEY: "ingestor",
    PUBLISHER_KEY: "publisher",
    DESK_KEY: "ingestor",
    GATEWAY_KEY: "gateway",
    "local": "client",
}

ALLOWED = "allowed.json"


class MissingKey(LookupError):
    """A key that is not there: ``candlewire keys init`` (or ``add-client``) makes it."""


@dataclass(frozen=True)
class Peer:
    role: str
    name: str
    user: str = ""

    def user_id(self) -> str:
        return f"{self.role}/{self.name}/{self.user}"

    @classmethod
    def parse(cls, user_id: str) -> Peer | None:
        return _parsed(user_id)


@functools.lru_cache(maxsize=4096)
def _parsed(user_id: str) -> Peer | None:
    """:meth:`Peer.parse`, once for each User-Id: every message on a keyed fast path names
    its sender, and a frozen dataclass made each time cost 0.9 µs (0.08 from here). A peer
    is immutable, so all of a sender's messages may share one."""
    parts = user_id.split("/")
    if len(parts) != 3 or parts[0] not in ROLES:
        return None
    return Peer(*parts)


def owned_id(settings: Settings, name: str) -> str:
    """``name`` under this process's key name when CURVE is on: the relay lets a client hear
    only ``RESPONSE:{key}.…`` and take client ids only there."""
    return f"{settings.security.key}.{name}" if settings.security.curve else name


def owner_of(settings: Settings, client_id: str) -> str:
    """Who is behind ``client_id``: with CURVE on, the key it is under (:func:`owned_id`;
    one key may name any number of client ids), else the client id itself."""
    return client_id.partition(".")[0] if settings.security.curve else client_id


def user_id_of(frame: zmq.Frame) -> str:
    """The ZAP User-Id of a message received with ``copy=False``; "" over inproc or
    without CURVE."""
    try:
        user_id = frame.get("User-Id")
    except zmq.ZMQError:
        return ""
    return user_id if isinstance(user_id, str) else ""


def peer_of(frame: zmq.Frame) -> Peer | None:
    """Who sent a message received with ``copy=False``; None over inproc or without CURVE."""
    user_id = user_id_of(frame)
    return Peer.parse(user_id) if user_id else None


def _no_peer(_frame: zmq.Frame) -> None:
    return None


def peer_reader(settings: Settings) -> Callable[[zmq.Frame], Peer | None]:
    """:func:`peer_of` for the sockets of these settings. Without CURVE no message has a
    User-Id, and asking for one raises: a few microseconds a message on a fast path."""
    return peer_of if settings.security.curve else _no_peer


def _check_name(name: str) -> str:
    # A name becomes a file name and a topic prefix: no dots (client ids are ``name.…``),
    # no slashes (the User-Id separator).
    if not name or len(name) > 64 or not all(c.isalnum() or c in "_-" for c in name):
        raise ValueError(f"key name {name!r} must be 1-64 of [A-Za-z0-9_-]")
    return name


class Keyring:
    """The key files under ``<state_dir>/keys`` (0700, each file 0600)."""

    def __init__(self, settings: Settings) -> None:
        self.dir = settings.keys_dir()

    def init(self) -> list[str]:
        """Make the server pairs and the services' client pairs that are missing."""
        made = [name for name in SERVERS if self._make(name)]
        for name, role in SERVICE_KEYS.items():
            if self._make(name):
                made.append(name)
            self._allow(name, role, "")
        return made

    def add_client(self, name: str, role: str, user: str = "") -> Path:
        """A client pair, allowed as ``role`` (a container for one ``user``)."""
        if role not in ROLES:
            raise ValueError(f"role {role!r} is not one of {', '.join(ROLES)}")
        if role == "container" and not user:
            raise ValueError("a container key is bound to one user: give --user")
        if user and ("/" in user or not user.strip()):
            raise ValueError(f"user {user!r} cannot hold '/'")
        if _check_name(name) in SERVERS:
            raise ValueError(f"{name!r} is a server key's name")
        self._make(name)
        self._allow(name, role, user)
        return self.dir / f"{name}.key_secret"

    def pair(self, name: str) -> tuple[bytes, bytes]:
        path = self.dir / f"{name}.key_secret"
        if not path.exists():
            raise MissingKey(f"no key {name!r} in {self.dir}; run `candlewire keys init`")
        public, secret = zmq.auth.load_certificate(path)
        if secret is None:
            raise MissingKey(f"{path} holds no secret key")
        return public, secret

    def public(self, name: str) -> bytes:
        return self.pair(name)[0]

    def has(self, name: str) -> bool:
        return (self.dir / f"{name}.key_secret").exists()

    def export(self, settings: Settings, name: str, bind_host: str | None = None) -> dict[str, Any]:
        """What a client in another language needs to act as ``name`` (see ``candlewire
        keys export --help``): its pair, its role, and for each channel its role may use,
        where to dial (every relay) and the server key to expect there, all z85."""
        if name in SERVERS:
            raise ValueError(f"{name!r} is a server key: its secret stays with its server")
        peer = next((p for p in self.allowed().values() if p.name == name), None)
        if peer is None:
            raise MissingKey(
                f"no allowed key {name!r} in {self.dir}; make one with "
                f"`candlewire keys add-client {name} --role ROLE`"
            )
        public, secret = self.pair(name)
        endpoints: dict[str, dict[str, Any]] = {}
        for channel, (server, endpoint) in CHANNEL_ENDPOINTS.items():
            if peer.role not in CHANNELS[channel]:
                continue
            entry: dict[str, Any] = {
                "server": server,
                "server_key": self.public(server).decode(),
                "pattern": ENDPOINTS[endpoint].pattern,
            }
            if channel == "events":
                # Where the container listens for gateways: the interface they reach it on,
                # which only its operator knows; 127.0.0.1 unless given (or set here).
                host = bind_host or settings.bind_host
                entry["bind"] = f"tcp://{host}:{settings.port(endpoint)}"
            elif server == "relay":
                entry["connect"] = settings.relays(endpoint)
            else:
                entry["connect"] = [settings.connect(endpoint)]
            endpoints[endpoint] = entry
        return {
            "format": EXPORT_FORMAT,
            "name": peer.name,
            "role": peer.role,
            "user": peer.user,
            "curve": bool(settings.security.curve),
            "public_key": public.decode(),
            "secret_key": secret.decode(),
            "relay_public_key": self.public("relay").decode(),
            "client_id_prefix": f"{peer.name}.",
            "endpoints": endpoints,
        }

    def allowed(self) -> dict[str, Peer]:
        """{z85 public key: peer}."""
        path = self.dir / ALLOWED
        if not path.exists():
            return {}
        return {k: Peer(**v) for k, v in json.loads(path.read_text()).items()}

    def _make(self, name: str) -> bool:
        if (self.dir / f"{name}.key_secret").exists():
            return False
        self.dir.mkdir(parents=True, exist_ok=True)
        self.dir.chmod(0o700)
        old = os.umask(0o077)
        try:
            public, secret = zmq.auth.create_certificates(self.dir, name)
        finally:
            os.umask(old)
        for path in (public, secret):
            Path(path).chmod(0o600)
        return True

    def _allow(self, name: str, role: str, user: str) -> None:
        key = self.public(name).decode()
        peers = {k: v for k, v in self.allowed().items() if v.name != name}
        peers[key] = Peer(role, name, user)
        path = self.dir / ALLOWED
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({k: vars(p) for k, p in peers.items()}, f, indent=1, sort_keys=True)
        tmp.replace(path)


def serve(sock: zmq.Socket, settings: Settings, server: str, channel: str) -> zmq.Socket:
    """Make ``sock`` the CURVE server of ``channel`` (before bind or connect); a no-op with
    CURVE off. The context must have a :class:`Guard`, or libzmq would let anyone in."""
    if not settings.security.curve:
        return sock
    if channel not in CHANNELS:
        raise ValueError(f"unknown channel {channel!r}")
    public, secret = Keyring(settings).pair(server)
    sock.curve_server = True
    sock.curve_publickey = public
    sock.curve_secretkey = secret
    sock.zap_domain = channel.encode()
    return sock


def dial(sock: zmq.Socket, settings: Settings, server: str, key: str | None = None) -> zmq.Socket:
    """Make ``sock`` a CURVE client of ``server`` with the key pair ``key`` (default the
    configured one); a no-op with CURVE off."""
    if not settings.security.curve:
        return sock
    ring = Keyring(settings)
    public, secret = ring.pair(key or settings.security.key)
    sock.curve_publickey = public
    sock.curve_secretkey = secret
    sock.curve_serverkey = ring.public(server)
    return sock


def client_conf(settings: Settings, server: str, key: str) -> dict[str, str]:
    """The same, as z85 text for the JVM side (JeroMQ), or nothing with CURVE off."""
    if not settings.security.curve:
        return {}
    ring = Keyring(settings)
    public, secret = ring.pair(key)
    return {
        "curve_public": public.decode(),
        "curve_secret": secret.decode(),
        "curve_server": ring.public(server).decode(),
    }


class _Authenticator(ThreadAuthenticator):
    def __init__(self, context: zmq.Context, guard: Guard) -> None:
        super().__init__(context, log=log)
        self._guard = guard

    def curve_user_id(self, client_public_key: bytes) -> str:
        peer = self._guard.peer(zmq.utils.z85.encode(client_public_key).decode())
        return peer.user_id() if peer else "anonymous"


class Guard:
    """The ZAP handler of one context: admits a key when the allow-list gives it a role its
    channel takes. The allow-list is read again when it changes, so ``keys add-client``
    needs no restart. ``on_refused(channel, reason)`` lets a service count refusals."""

    def __init__(
        self,
        ctx: zmq.Context,
        settings: Settings,
        on_refused: Callable[[str, str], None] | None = None,
    ) -> None:
        self._ring = Keyring(settings)
        self._on_refused = on_refused
        self._lock = threading.Lock()
        self._stamp: float | None = None
        self._peers: dict[str, Peer] = {}
        # A synchronous view of the same libzmq context: the handler runs in its own thread,
        # also for services on asyncio (the gateway).
        self._auth = _Authenticator(zmq.Context.shadow(ctx.underlying), self)
        self._auth.start()
        for channel in CHANNELS:
            self._auth.configure_curve_callback(channel, self)

    @classmethod
    def start(
        cls,
        ctx: zmq.Context,
        settings: Settings,
        on_refused: Callable[[str, str], None] | None = None,
    ) -> Guard | None:
        return cls(ctx, settings, on_refused) if settings.security.curve else None

    def peer(self, key: str) -> Peer | None:
        path = self._ring.dir / ALLOWED
        with self._lock:
            stamp = path.stat().st_mtime if path.exists() else None
            if stamp != self._stamp:
                self._peers, self._stamp = self._ring.allowed(), stamp
            return self._peers.get(key)

    def callback(self, domain: str, key: bytes) -> bool:
        peer = self.peer(key.decode())
        if peer is not None and peer.role in CHANNELS.get(domain, ()):
            return True
        reason = "unknown_key" if peer is None else "wrong_role"
        log.warning("refused a %s peer on %s: %s", peer.role if peer else "?", domain, reason)
        if self._on_refused is not None:
            self._on_refused(domain, reason)
        return False

    def stop(self) -> None:
        self._auth.stop()
