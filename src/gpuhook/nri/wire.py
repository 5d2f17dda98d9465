"""NRI's wire (pure): ttrpc messages over a multiplexed unix socket.

The facts, from containerd/nri v0.12.0 (``pkg/net/multiplex``) and containerd/ttrpc:

- **The mux.** One unix socket carries logical connections; each write is one frame, an 8-byte
  header (connection id, payload length: big-endian uint32s) and the payload (at most
  ``MUX_MAX`` bytes). Connection 1 carries the plugin's service (the engine calls the plugin),
  connection 2 the engine's (the plugin registers). Frames for other connections are dropped.
  Each connection is a byte stream: a ttrpc message may span frames. The receiving end hands one
  frame to one read of ttrpc's reader, whose buffer is 4096 bytes (Go's bufio default), and a
  frame larger than the read fails it (ENOMEM: containerd closes the plugin, "ttrpc: closed"),
  so gpuhook sends frames of at most ``SEND_CHUNK`` bytes, as Go's buffered writer does.
- **ttrpc.** A 10-byte header (payload length and stream id: big-endian uint32s; type, flags:
  one byte each) and a protobuf payload of at most 4 MiB. A request (type 1) carries
  ``ttrpc.Request`` (service, method, payload), its response (type 2, same stream id)
  ``ttrpc.Response`` (a status and the payload). Client streams have odd ids.

A length beyond these limits is a :class:`FrameError`: the connection cannot be read on and is
closed (whatever follows cannot be placed), never waited on.
"""

from __future__ import annotations

import struct

from gpuhook.model.frozen import Frozen

MUX_HEADER = struct.Struct(">II")
TTRPC_HEADER = struct.Struct(">IIBB")
TTRPC_MAX = 4 << 20
MUX_MAX = TTRPC_HEADER.size + TTRPC_MAX
SEND_CHUNK = 4096  # what one read of the engine's ttrpc reader takes at least

PLUGIN_CONN = 1  # the plugin's service: the engine calls Configure, CreateContainer, ...
RUNTIME_CONN = 2  # the engine's service: the plugin calls RegisterPlugin

REQUEST = 1
RESPONSE = 2
DATA = 3

# gRPC status codes ttrpc answers with
OK = 0
UNKNOWN = 2
INVALID_ARGUMENT = 3
UNIMPLEMENTED = 12


class FrameError(Exception):
    """A frame that breaks the protocol's limits; ``str()`` is one line."""


class Message(Frozen):
    """One ttrpc message as it came off a mux connection."""

    conn: int
    stream: int
    type: int
    flags: int
    payload: bytes


def mux(conn: int, payload: bytes, chunk_size: int = SEND_CHUNK) -> bytes:
    """``payload`` framed for mux connection ``conn``, in frames of at most ``chunk_size``."""
    out = bytearray()
    for start in range(0, max(len(payload), 1), chunk_size):
        chunk = payload[start : start + chunk_size]
        out += MUX_HEADER.pack(conn, len(chunk)) + chunk
    return bytes(out)


def ttrpc(stream: int, kind: int, payload: bytes, flags: int = 0) -> bytes:
    """One ttrpc message. Raises FrameError when the payload is over ttrpc's limit."""
    if len(payload) > TTRPC_MAX:
        raise FrameError(f"ttrpc message of {len(payload)} bytes is over the 4 MiB limit")
    return TTRPC_HEADER.pack(len(payload), stream, kind, flags) + payload


def frame(conn: int, stream: int, kind: int, payload: bytes) -> bytes:
    """A ttrpc message sent on mux connection ``conn``."""
    return mux(conn, ttrpc(stream, kind, payload))


class Reader:
    """Bytes off the socket in, whole ttrpc messages out (:meth:`feed`), in order. Keeps the
    partial frame and the partial message of each connection between reads."""

    def __init__(self) -> None:
        self._trunk = bytearray()
        self._streams: dict[int, bytearray] = {PLUGIN_CONN: bytearray(), RUNTIME_CONN: bytearray()}

    def feed(self, data: bytes) -> list[Message]:
        """The messages completed by ``data``. Raises FrameError."""
        self._trunk += data
        out: list[Message] = []
        while len(self._trunk) >= MUX_HEADER.size:
            conn, size = MUX_HEADER.unpack_from(self._trunk)
            if size > MUX_MAX:
                raise FrameError(f"mux frame of {size} bytes is over the {MUX_MAX}-byte limit")
            if len(self._trunk) < MUX_HEADER.size + size:
                break
            chunk = bytes(self._trunk[MUX_HEADER.size : MUX_HEADER.size + size])
            del self._trunk[: MUX_HEADER.size + size]
            stream = self._streams.get(conn)
            if stream is not None:  # another connection id: dropped, as NRI's mux does
                stream += chunk
                out += _messages(conn, stream)
        return out

    def pending(self) -> int:
        """Bytes held that make no whole message yet."""
        return len(self._trunk) + sum(len(s) for s in self._streams.values())


def _messages(conn: int, stream: bytearray) -> list[Message]:
    out: list[Message] = []
    while len(stream) >= TTRPC_HEADER.size:
        length, sid, kind, flags = TTRPC_HEADER.unpack_from(stream)
        if length > TTRPC_MAX:
            raise FrameError(
                f"ttrpc message of {length} bytes on connection {conn} is over the 4 MiB limit"
            )
        end = TTRPC_HEADER.size + length
        if len(stream) < end:
            break
        out.append(Message(conn, sid, kind, flags, bytes(stream[TTRPC_HEADER.size : end])))
        del stream[:end]
    return out
