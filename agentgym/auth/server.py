"""The serving side of CURVE security (the learner and the relay): its key pair, the allow-list of
actor keys, the bind check.

    keys = ServerKeys.load(lc.secret_key, lc.authorized_keys)   # None: plain TCP
    check_bind(lc.bind, keys, lc.insecure)                      # refuses an open non-loopback bind
    auth = start_authenticator(ctx, keys)                       # ZAP handler for that context
    make_server(sock, keys)                                     # before sock.bind(...)

pyzmq's ``zmq.auth.thread.ThreadAuthenticator`` answers ZeroMQ's ZAP requests: every connection
to a CURVE socket of the context is checked before any message of it is delivered, so an unknown
peer never reaches the learner's code (docs/adr/0009-authentication.md). The allow-list is a
directory of public ``.key`` files, re-read when it changes, so actors can be added to a running
learner by copying a file there.
"""

from __future__ import annotations

import ipaddress
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import structlog
import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from agentgym.auth.keys import KeyFileError, load_keypair

log = structlog.get_logger(__name__)
ZAP_DOMAIN = "agentgym"


class InsecureBind(ValueError):
    """A non-loopback bind without keys and without the explicit opt-out."""


@dataclass(frozen=True)
class ServerKeys:
    public: bytes
    secret: bytes
    authorized: Path

    @classmethod
    def load(cls, secret_key: Path | None, authorized: Path | None) -> ServerKeys | None:
        if secret_key is None and authorized is None:
            return None
        if secret_key is None or authorized is None:
            raise KeyFileError(
                "learner.secret_key and learner.authorized_keys go together: set both (CURVE) or neither"
            )
        if not Path(authorized).is_dir():
            raise KeyFileError(f"learner.authorized_keys {authorized} is not a directory of actors' public .key files")
        public, secret = load_keypair(secret_key)
        return cls(public, secret, Path(authorized))


def is_loopback(bind: str) -> bool:
    """True for tcp://127.x.x.x:P, tcp://[::1]:P and tcp://localhost:P; anything else (a wildcard,
    an interface name, another address) may be reachable from other hosts."""
    host = bind.removeprefix("tcp://").rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(bind: str, keys: ServerKeys | None, insecure: bool) -> None:
    if keys is None and not insecure and not is_loopback(bind):
        raise InsecureBind(
            f"learner.bind {bind} is reachable from other hosts but no CURVE keys are configured: anyone who "
            "reaches the ports could register, submit rollouts and download the weights. Write keys with "
            "`agentgym keys DIR` and set learner.secret_key / learner.authorized_keys (--secret-key, "
            "--authorized-keys), or accept the risk explicitly with --insecure (learner.insecure=true)"
        )


def check_server_config(lc: object) -> str | None:
    """What is wrong with a learner config's keys or bind (None: nothing), for a clean exit."""
    try:
        keys = ServerKeys.load(lc.secret_key, lc.authorized_keys)  # type: ignore[attr-defined]  # lc: a LearnerConfig, typed object here
        check_bind(lc.bind, keys, lc.insecure)  # type: ignore[attr-defined]  # lc: a LearnerConfig, typed object here
    except (KeyFileError, InsecureBind) as exc:
        return str(exc)
    return None


class AllowList:
    """ZAP credentials provider: a client key is admitted iff its ``.key`` file is in the directory.

    Re-reads the directory when its modification time changes. Counts refusals (read by the hub)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._stamp: int | None = None
        self._keys: dict[bytes, bool] = {}
        self._lock = threading.Lock()
        self.refused = 0
        self.admitted = 0
        self._reload()

    def _reload(self) -> None:
        stamp = os.stat(self.directory).st_mtime_ns
        if stamp == self._stamp:
            return
        self._keys = zmq.auth.load_certificates(self.directory)
        self._stamp = stamp
        log.info("allow_list_loaded", directory=str(self.directory), keys=len(self._keys))

    def callback(self, domain: str, key: bytes) -> bool:
        with self._lock:
            try:
                self._reload()
            except OSError as exc:  # directory gone or unreadable: keep the keys last read
                log.error("allow_list_unreadable", directory=str(self.directory), error=str(exc))
            ok = bool(self._keys.get(key))
            if ok:
                self.admitted += 1
            else:
                self.refused += 1
                log.warning("peer_refused_unknown_key", key=key.decode("ascii", "replace"))
        return ok


def start_authenticator(ctx: zmq.Context, keys: ServerKeys) -> tuple[ThreadAuthenticator, AllowList]:
    """Start the ZAP handler of ``ctx`` (stop it with ``auth.stop()`` before the context ends)."""
    allow = AllowList(keys.authorized)
    auth = ThreadAuthenticator(ctx)
    auth.start()
    # pyzmq looks the provider up by the socket's exact ZAP domain ("*" only stands for an empty one)
    auth.configure_curve_callback(domain=ZAP_DOMAIN, credentials_provider=allow)
    return auth, allow


def make_server(sock: zmq.Socket, keys: ServerKeys | None) -> None:
    """Make ``sock`` a CURVE server (call before bind); no-op without keys."""
    if keys is None:
        return
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public
    sock.curve_server = True
    sock.zap_domain = ZAP_DOMAIN.encode()
