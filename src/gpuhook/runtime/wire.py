"""The runtime service's wire protocol: the contract with the C dispatcher, whose side
(``packaging/gpuhook-runtime.c.in``) is rendered from these constants by
:mod:`gpuhook.runtime.dispatch`. Pure; one ``SOCK_SEQPACKET`` message each way.

request
    ``PROTOCOL NUL``, ``<argc> NUL``, argc NUL-terminated argv strings (argv[0] included),
    ``<envc> NUL``, envc NUL-terminated ``KEY=VALUE`` strings; with ``SCM_RIGHTS`` carrying
    exactly :data:`FDS` descriptors: the caller's stdin, stdout, stderr and its working folder
    (opened ``O_PATH | O_DIRECTORY``). At most :data:`MAX_REQUEST` bytes.
reply
    :data:`EXEC` + the runtime's path: the dispatcher execs it with its own argv[1:];
    :data:`EXIT` + a decimal exit code: the dispatcher exits with it (the one-line error is
    already on its stderr); :data:`DECLINE` + a reason: the dispatcher starts Python itself.
    At most :data:`MAX_REPLY` bytes (a reason is cut to fit).
no reply
    The connection ends without a reply when the worker died mid-call (the service killed,
    restarted, upgraded). The dispatcher then runs Python itself, as for :data:`DECLINE`; for a
    create, after putting ``config.json`` back as the engine wrote it (it keeps the bytes, up to
    :data:`MAX_SAVED_SPEC`, while the service decides), so the create is decided once, whole,
    whatever the dead worker had written. A spec it could not keep fails the create (one line).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

PROTOCOL = b"gpuhook-runtime/1"
EXEC = b"X"
EXIT = b"R"
DECLINE = b"F"
MAX_REQUEST = 1 << 20
FDS = 4
MAX_REPLY = 1 + 4096  # the kind and a path of PATH_MAX bytes
MAX_SAVED_SPEC = 64 << 20  # the largest config.json the dispatcher keeps to retry a create


class Declined(Exception):
    """A request the service leaves to the dispatcher; ``str()`` is the reason it is sent."""


class Request:
    """A decoded request: the caller's argv (argv[0] included) and environment (the first of a
    repeated name wins, as for a process)."""

    __slots__ = ("argv", "env")

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.argv = argv
        self.env = env



def encode_request(argv: Sequence[str | bytes], env: Sequence[str | bytes]) -> bytes:
    """The request message for ``argv`` and ``env`` (``KEY=VALUE`` strings)."""
    fields = [
        PROTOCOL,
        str(len(argv)).encode(),
        *(os.fsencode(a) for a in argv),
        str(len(env)).encode(),
        *(os.fsencode(e) for e in env),
    ]
    if any(b"\0" in field for field in fields):
        raise ValueError("a request field holds a NUL byte")
    return b"".join(field + b"\0" for field in fields)


def decode_request(data: bytes) -> Request:
    """Parse a request message; raises :class:`Declined` with the reason when it is malformed."""
    if len(data) > MAX_REQUEST:
        raise Declined(f"request of {len(data)} bytes (at most {MAX_REQUEST})")
    if not data.startswith(PROTOCOL + b"\0"):
        raise Declined(f"not a {PROTOCOL.decode()} request")
    if not data.endswith(b"\0"):
        raise Declined("the request does not end with a NUL byte")
    fields = data[:-1].split(b"\0")
    argv, pos = _strings(fields, 1, "argv")
    if not argv:
        raise Declined("argc is 0: argv[0] is missing")
    entries, pos = _strings(fields, pos, "environment")
    if pos != len(fields):
        raise Declined(f"{len(fields) - pos} fields after the environment")
    env: dict[str, str] = {}
    for entry in entries:
        key, sep, value = entry.partition("=")
        if not sep or not key:
            raise Declined(f"environment entry {entry[:40]!r} is not KEY=VALUE")
        env.setdefault(key, value)
    return Request(argv, env)


def _strings(fields: list[bytes], pos: int, what: str) -> tuple[list[str], int]:
    """The count at ``fields[pos]`` and that many strings after it; the position after them."""
    if pos >= len(fields):
        raise Declined(f"the {what} count is missing")
    field = fields[pos]
    if not field.isdigit() or len(field) > 7 or (len(field) > 1 and field.startswith(b"0")):
        raise Declined(f"the {what} count {field[:20]!r} is not a decimal number")
    count = int(field)
    end = pos + 1 + count
    if end > len(fields):
        raise Declined(f"the {what} count is {count} but {len(fields) - pos - 1} fields follow")
    return [os.fsdecode(f) for f in fields[pos + 1 : end]], end


def encode_reply(kind: bytes, payload: bytes) -> bytes:
    """A reply message; a :data:`DECLINE` reason is cut to :data:`MAX_REPLY`."""
    if kind not in (EXEC, EXIT, DECLINE):
        raise ValueError(f"unknown reply kind {kind!r}")
    reply = kind + payload
    if kind == DECLINE:
        return reply[:MAX_REPLY]
    if len(reply) > MAX_REPLY or b"\0" in payload:
        raise ValueError(f"reply {reply[:40]!r} is too long or holds a NUL byte")
    return reply


def decode_reply(data: bytes) -> tuple[bytes, bytes]:
    """``(kind, payload)`` of a reply (what the dispatcher reads); ValueError when malformed."""
    kind, payload = data[:1], data[1:]
    if len(data) > MAX_REPLY:
        raise ValueError(f"reply of {len(data)} bytes (at most {MAX_REPLY})")
    if kind == EXEC and payload.startswith(b"/") and b"\0" not in payload:
        return kind, payload
    if kind == EXIT and payload.isdigit() and len(payload) <= 3 and int(payload) <= 255:
        return kind, payload
    if kind == DECLINE:
        return kind, payload
    raise ValueError(f"malformed reply {data[:40]!r}")
