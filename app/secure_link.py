"""A direct, encrypted and mutually authenticated link between the primary and one secondary's
party worker (app/party_worker.py), for the tensors of a deployed run (run config
``transport = "direct"``; docs/deployment.md "Direct transport").

Both ends hold a fresh 32-byte key that the primary drew for this run and party and sent over
Flower (TLS, SuperNode authentication): Flower authenticates the parties, this link carries the
bytes. The handshake proves each side holds the key (HMAC-SHA256 over both sides' fresh nonces),
then every message travels in ChaCha20-Poly1305 frames under a key per direction derived from the
run key and both nonces (HKDF-SHA256). A frame's nonce is its counter: a replayed, reordered,
dropped or altered frame fails to decrypt, and the link is closed with an error naming it.

Message: kind (1 byte: Q request, R reply, E error) | sequence (8) | type length (2) | type |
body (a Flower RecordDict in its protobuf form; a training step, either mode's, packed without
Flower's records, strategies/wire_bytes.py; or an error's text).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
import struct
import time

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

KEY_BYTES = 32
CHUNK = 16 << 20  # plaintext bytes per frame (ChaCha20-Poly1305 takes < 2 GiB per call)
TAG = 16  # Poly1305's tag: a frame is at most CHUNK + TAG bytes, refused before any allocation
MAX_MESSAGE = 2 << 30  # a message over 2 GiB is refused (an evaluation chunk of 50,000 tokens is ~20 MB)
_HELLO = b"fedsim-direct-1"
_FRAME = struct.Struct(">I?")  # ciphertext length, last frame of the message
_HEAD = struct.Struct(">cQH")  # kind, sequence, type length


class LinkError(ConnectionError):
    """The peer failed to authenticate, closed the link, or sent a frame that does not decrypt."""


class LinkClosed(LinkError):
    """The peer closed the link between two messages: its end of the run, not an error."""


def new_key() -> str:
    """A fresh run key (hex), drawn from the OS's secret randomness by the primary."""
    return secrets.token_hex(KEY_BYTES)


def host_port(address: str, what: str) -> tuple[str, int]:
    """HOST:PORT (an IPv6 host in brackets or bare) as (host, port); ``what`` names the setting."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{what} must be HOST:PORT, got {address!r}")
    return host.strip("[]"), int(port)


def _key_bytes(key: str) -> bytes:
    raw = bytes.fromhex(key)
    if len(raw) != KEY_BYTES:
        raise ValueError(f"a direct-link key has {KEY_BYTES} bytes, got {len(raw)}")
    return raw


def _derive(key: bytes, salt: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=info).derive(key)


def keepalive(sock: socket.socket, idle: int = 30, interval: int = 10, count: int = 3) -> None:
    """A peer whose host vanished (no FIN) is noticed in about idle + interval * count seconds,
    not the OS default of two hours; a waiting worker then exits."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", interval), ("TCP_KEEPCNT", count)):
        if hasattr(socket, name):  # Linux; elsewhere the OS's defaults
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def _proof(key: bytes, role: bytes, nonces: bytes) -> bytes:
    return hmac.new(key, _HELLO + role + nonces, hashlib.sha256).digest()


def _read_exact(sock: socket.socket, n: int, between: bool = False, deadline: float | None = None) -> bytes:
    """``n`` bytes; ``between``: at a message's start, where a closed link is :class:`LinkClosed`;
    ``deadline`` (time.monotonic()): socket.timeout once passed, however the bytes trickle in."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout(f"no whole message within the deadline ({got} of {n} bytes read)")
            sock.settimeout(left)
        r = sock.recv_into(view[got:], n - got)
        if r == 0:
            raise (LinkClosed if between and got == 0 else LinkError)(
                f"the peer closed the link ({got} of {n} bytes read)"
            )
        got += r
    return bytes(buf)


class SecureLink:
    """One authenticated, encrypted, ordered message stream over a TCP socket."""

    def __init__(self, sock: socket.socket, send_key: bytes, recv_key: bytes) -> None:
        self.sock = sock
        self._send, self._recv = ChaCha20Poly1305(send_key), ChaCha20Poly1305(recv_key)
        self._sent = self._received = 0  # frames each way: the nonces

    @classmethod
    def connect(cls, address: str, key: str, timeout: float) -> "SecureLink":
        """The primary's end: connect to a worker at host:port and authenticate both ways, all
        within ``timeout`` seconds however the worker trickles its bytes."""
        deadline = time.monotonic() + timeout
        sock = socket.create_connection(host_port(address, "a worker's address"), timeout=timeout)
        try:
            return cls._handshake(sock, _key_bytes(key), True, deadline)
        except BaseException:
            sock.close()
            raise

    @classmethod
    def accept(cls, sock: socket.socket, key: str, deadline: float | None = None) -> "SecureLink":
        """The worker's end of a connection it accepted, authenticated by ``deadline`` (time.monotonic())."""
        return cls._handshake(sock, _key_bytes(key), False, deadline)

    @classmethod
    def _handshake(cls, sock: socket.socket, key: bytes, primary: bool, deadline: float | None) -> "SecureLink":
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        keepalive(sock)
        timeout = sock.gettimeout()  # put back once authenticated: the deadline's reads shorten it
        if primary:
            worker_nonce = _read_exact(sock, 32, deadline=deadline)
            own = secrets.token_bytes(32)
            nonces = worker_nonce + own
            sock.sendall(own + _proof(key, b"primary", nonces))
            if not hmac.compare_digest(_read_exact(sock, 32, deadline=deadline), _proof(key, b"worker", nonces)):
                raise LinkError("the worker did not prove it holds this run's key: refusing the link")
        else:
            own = secrets.token_bytes(32)
            sock.sendall(own)
            theirs = _read_exact(sock, 32, deadline=deadline)
            nonces = own + theirs
            if not hmac.compare_digest(_read_exact(sock, 32, deadline=deadline), _proof(key, b"primary", nonces)):
                raise LinkError("the peer did not prove it holds this run's key: refusing the link")
            sock.sendall(_proof(key, b"worker", nonces))
        sock.settimeout(timeout)
        p2w, w2p = _derive(key, nonces, b"primary->worker"), _derive(key, nonces, b"worker->primary")
        return cls(sock, p2w, w2p) if primary else cls(sock, w2p, p2w)

    def send(self, kind: bytes, seq: int, message_type: str, body: bytes) -> None:
        name = message_type.encode()
        data = memoryview(_HEAD.pack(kind, seq, len(name)) + name + body)
        start = 0
        while True:
            piece, start = data[start : start + CHUNK], start + CHUNK
            last = start >= len(data)
            frame = self._send.encrypt(self._sent.to_bytes(12, "big"), bytes(piece), bytes([last]))
            self._sent += 1
            self.sock.sendall(_FRAME.pack(len(frame), last) + frame)
            if last:
                return

    def recv(self, deadline: float | None = None) -> tuple[bytes, int, str, bytes]:
        """(kind, sequence, message type, body) of the next message, whole by ``deadline``
        (time.monotonic(); None: wait as long as the link is up)."""
        parts, size = [], 0
        while True:
            length, last = _FRAME.unpack(_read_exact(self.sock, _FRAME.size, not parts, deadline))
            size += length
            if length > CHUNK + TAG or size > MAX_MESSAGE:
                raise LinkError(
                    f"the peer announced a frame of {length} bytes (at most {CHUNK + TAG}) or a message "
                    f"over {MAX_MESSAGE} bytes: refusing it"
                )
            try:
                parts.append(
                    self._recv.decrypt(
                        self._received.to_bytes(12, "big"),
                        _read_exact(self.sock, length, False, deadline),
                        bytes([last]),
                    )
                )
            except Exception as e:  # cryptography's InvalidTag: altered, replayed or out of order
                raise LinkError(
                    f"frame {self._received} does not decrypt (altered, replayed or out of order): closing the link"
                ) from e
            self._received += 1
            if last:
                break
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        try:
            kind, seq, n = _HEAD.unpack_from(data)
            return kind, seq, data[_HEAD.size : _HEAD.size + n].decode(), data[_HEAD.size + n :]
        except (struct.error, UnicodeDecodeError) as e:
            raise LinkError(f"a malformed message header: {e}") from e

    def settimeout(self, seconds: float | None) -> None:
        self.sock.settimeout(seconds)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
