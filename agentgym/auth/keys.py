"""CURVE key files: writing the layout ``agentgym keys`` hands out, and loading a key pair with
an error that names the file (docs/adr/0009-authentication.md).

    write_keys(Path("keys"), ["actor-0", "actor-1"])   # learner pair + one pair per actor
    public, secret = load_keypair(Path("keys/learner.key_secret"))
    apply_client(sock, client_keys)                    # before sock.connect(...)

Layout of DIR (ZeroMQ's own certificate files, readable by ``zmq.auth.load_certificate``):

    DIR/learner.key_secret        learner's pair: stays on the learner host
    DIR/learner.key               learner's public key: copied to every actor host
    DIR/authorized/NAME.key       actors' public keys: the learner's allow-list directory
    DIR/actors/NAME.key_secret    an actor's pair: copied to that actor's host only

Used by the learner, the actors and the relay (``learner/`` and ``actors/`` never import each other).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth


class KeyFileError(ValueError):
    """A key file is missing, unreadable or not the kind of key expected."""


def load_keypair(path: Path) -> tuple[bytes, bytes]:
    """(public, secret) z85 keys from a ``.key_secret`` file."""
    public, secret = _load(path)
    if secret is None:
        raise KeyFileError(f"{path} holds only a public key; a secret key file (NAME.key_secret) is needed here")
    return public, secret


def load_public(path: Path) -> bytes:
    """The z85 public key of a ``.key`` (or ``.key_secret``) file."""
    return _load(path)[0]


def _load(path: Path) -> tuple[bytes, bytes | None]:
    path = Path(path)
    if not path.is_file():
        raise KeyFileError(f"key file {path} does not exist (write keys with `agentgym keys DIR`)")
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise KeyFileError(f"{path} is not a ZeroMQ certificate file: {exc}") from None
    if public is None or len(public) != 40:
        raise KeyFileError(f"{path} has no valid public-key line (40 z85 characters)")
    if secret is not None and len(secret) != 40:
        raise KeyFileError(f"{path} has a malformed secret-key line")
    return public, secret


@dataclass(frozen=True)
class ClientKeys:
    """What an actor's sockets need to connect to a learner that requires CURVE."""

    public: bytes
    secret: bytes
    server: bytes
    """The learner's public key: the actor talks only to the holder of its secret."""

    @classmethod
    def load(cls, secret_key: Path | None, learner_key: Path | None) -> ClientKeys | None:
        if secret_key is None and learner_key is None:
            return None
        if secret_key is None or learner_key is None:
            raise KeyFileError(
                "actor.secret_key and actor.learner_key go together: set both (CURVE) or neither (plain TCP)"
            )
        public, secret = load_keypair(secret_key)
        return cls(public, secret, load_public(learner_key))


def apply_client(sock: zmq.Socket, keys: ClientKeys | None) -> None:
    """Make ``sock`` a CURVE client (call before connect); no-op without keys."""
    if keys is None:
        return
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public
    sock.curve_serverkey = keys.server


def write_keys(directory: Path, actors: list[str]) -> list[Path]:
    """Write the layout of the module docstring; an existing learner pair is kept (so actors can
    be added later), an existing actor name is refused. Returns the files written."""
    directory = Path(directory)
    (directory / "authorized").mkdir(parents=True, exist_ok=True)
    (directory / "actors").mkdir(parents=True, exist_ok=True)
    written = []
    if not (directory / "learner.key_secret").exists():
        pub, sec = zmq.auth.create_certificates(directory, "learner")
        written += [Path(pub), Path(sec)]
    for name in actors:
        if not name or "/" in name or name.startswith("."):
            raise KeyFileError(f"actor name {name!r} cannot be a file name")
        if (directory / "actors" / f"{name}.key_secret").exists():
            raise KeyFileError(f"{directory / 'actors' / (name + '.key_secret')} exists already; pick another name")
        pub, sec = zmq.auth.create_certificates(directory / "actors", name)
        allowed = directory / "authorized" / f"{name}.key"
        shutil.move(pub, allowed)  # the public half lives only in the allow-list directory
        written += [allowed, Path(sec)]
    for p in written:
        if p.name.endswith(".key_secret"):
            p.chmod(0o600)
    return written
