"""gpuhook nri's wire: mux and ttrpc framing, malformed input, and the plugin's answers to calls
it cannot serve (a status, never a hang), against a fake engine on a socketpair."""

from __future__ import annotations

import socket
import struct
import subprocess
import threading
from typing import Any

import pytest

from gpuhook.nri import nri_api_pb2 as api
from gpuhook.nri import plugin, wire
from gpuhook.nri import ttrpc_pb2 as ttrpc


def _request(method: str, payload: bytes, service: str = plugin.PLUGIN_SERVICE) -> bytes:
    out: bytes = ttrpc.Request(service=service, method=method, payload=payload).SerializeToString()
    return out


def _plugin(log: list[Any] | None = None) -> plugin.Plugin:
    def load() -> Any:
        raise AssertionError("no config is read for these calls")

    seen = log if log is not None else []

    def note(event: str, **fields: Any) -> None:
        seen.append((event, fields))

    return plugin.Plugin("/nonexistent", "10", load_config=load, log=note)


def test_a_message_split_anywhere_comes_out_whole_and_in_order() -> None:
    data = wire.frame(1, 3, wire.REQUEST, b"abc") + wire.frame(2, 1, wire.RESPONSE, b"")
    for cut in range(len(data) + 1):
        reader = wire.Reader()
        got = reader.feed(data[:cut]) + reader.feed(data[cut:])
        assert [(m.conn, m.stream, m.type, m.payload) for m in got] == [
            (1, 3, wire.REQUEST, b"abc"),
            (2, 1, wire.RESPONSE, b""),
        ]
        assert reader.pending() == 0


def test_a_ttrpc_message_may_span_mux_frames_and_other_connections_are_dropped() -> None:
    msg = wire.ttrpc(5, wire.REQUEST, b"x" * 100)
    data = wire.mux(1, msg[:7]) + wire.mux(9, b"noise") + wire.mux(1, msg[7:])
    (got,) = wire.Reader().feed(data)
    assert (got.conn, got.stream, got.payload) == (1, 5, b"x" * 100)


def test_a_large_message_is_sent_in_frames_one_read_of_the_engine_takes() -> None:
    """containerd's ttrpc reader reads a mux frame into a 4096-byte buffer: a larger frame
    fails the read and containerd drops the plugin (seen: "ttrpc: closed")."""
    data = wire.frame(1, 3, wire.RESPONSE, b"y" * 10000)
    sizes = []
    while data:
        conn, size = struct.unpack(">II", data[:8])
        sizes.append((conn, size))
        data = data[8 + size :]
    assert sizes == [(1, 4096), (1, 4096), (1, 10010 - 8192)]


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (struct.pack(">II", 1, wire.MUX_MAX + 1), "mux frame of"),
        (wire.mux(1, struct.pack(">IIBB", wire.TTRPC_MAX + 1, 1, 1, 0)), "ttrpc message of"),
    ],
)
def test_lengths_over_the_limits_are_an_error_not_a_wait(data: bytes, error: str) -> None:
    with pytest.raises(wire.FrameError, match=error):
        wire.Reader().feed(data)
    with pytest.raises(wire.FrameError):
        wire.ttrpc(1, wire.REQUEST, b"z" * (wire.TTRPC_MAX + 1))


def _status(frame: bytes) -> tuple[int, int, str, bytes]:
    (msg,) = wire.Reader().feed(frame)
    reply = ttrpc.Response.FromString(msg.payload)
    return msg.stream, reply.status.code, reply.status.message, reply.payload


@pytest.mark.parametrize(
    ("payload", "stream", "code", "text"),
    [
        (b"\xff\xff\xff", 1, wire.INVALID_ARGUMENT, "unmarshal request error"),
        (_request("Frobnicate", b""), 3, wire.UNIMPLEMENTED, "Frobnicate is not implemented"),
        (_request("Configure", b"", "other.Service"), 5, wire.UNIMPLEMENTED, "other.Service"),
        (_request("CreateContainer", b"\x0a\xff"), 7, wire.INVALID_ARGUMENT, "CreateContainer"),
        (_request("Configure", b""), 2, wire.INVALID_ARGUMENT, "must be odd"),
    ],
)
def test_calls_the_plugin_cannot_serve_get_an_error_status(
    payload: bytes, stream: int, code: int, text: str
) -> None:
    msg = wire.Message(wire.PLUGIN_CONN, stream, wire.REQUEST, 0, payload)
    got_stream, got_code, message, _ = _status(_plugin().answer(msg))
    assert (got_stream, got_code) == (stream, code)
    assert text in message


def test_configure_subscribes_to_create_stop_and_remove_container() -> None:
    body = api.ConfigureRequest(runtime_name="containerd", runtime_version="v2.3.4")
    msg = wire.Message(1, 1, wire.REQUEST, 0, _request("Configure", body.SerializeToString()))
    _, code, _, payload = _status(_plugin().answer(msg))
    events = api.ConfigureResponse.FromString(payload).events
    assert code == wire.OK
    # one bit per event, bit (event - 1): CreateContainer 4, StopContainer 10, RemoveContainer 11
    assert events == (1 << 3) | (1 << 9) | (1 << 10)


class FakeEngine:
    """The engine's end of a socketpair: reads the plugin's frames, writes whatever it is told."""

    def __init__(self) -> None:
        self.mine, self.theirs = socket.socketpair()
        self.reader = wire.Reader()

    def messages(self, count: int) -> list[wire.Message]:
        out: list[wire.Message] = []
        self.mine.settimeout(5)
        while len(out) < count:
            data = self.mine.recv(1 << 16)
            assert data, "the plugin closed the connection"
            out += self.reader.feed(data)
        return out


def _session(engine: FakeEngine, p: plugin.Plugin) -> threading.Thread:
    def serve() -> None:
        try:
            p._register(engine.theirs)
            p._serve(engine.theirs, wire.Reader(), registered=False)
        except (plugin.Closed, wire.FrameError) as exc:
            errors.append(exc)

    errors: list[BaseException] = []
    thread = threading.Thread(target=serve, daemon=True)
    thread.errors = errors  # type: ignore[attr-defined]
    thread.start()
    return thread


def test_registration_then_a_frame_over_the_limit_ends_the_session_at_once() -> None:
    engine = FakeEngine()
    thread = _session(engine, _plugin())
    (register,) = engine.messages(1)
    call = ttrpc.Request.FromString(register.payload)
    body = api.RegisterPluginRequest.FromString(call.payload)
    assert (register.conn, register.stream, register.type) == (2, 1, wire.REQUEST)
    assert (call.service, call.method) == (plugin.RUNTIME_SERVICE, "RegisterPlugin")
    assert (body.plugin_name, body.plugin_idx) == ("gpuhook", "10")
    engine.mine.sendall(wire.frame(2, 1, wire.RESPONSE, ttrpc.Response().SerializeToString()))
    engine.mine.sendall(struct.pack(">II", 1, wire.MUX_MAX + 1))
    thread.join(5)
    assert not thread.is_alive()
    assert isinstance(thread.errors[0], wire.FrameError)  # type: ignore[attr-defined]


def test_a_refused_registration_ends_the_session() -> None:
    engine = FakeEngine()
    thread = _session(engine, _plugin())
    engine.messages(1)
    refused = ttrpc.Response(status=ttrpc.Status(code=2, message="invalid plugin index"))
    engine.mine.sendall(wire.frame(2, 1, wire.RESPONSE, refused.SerializeToString()))
    thread.join(5)
    assert "invalid plugin index" in str(thread.errors[0])  # type: ignore[attr-defined]


@pytest.mark.parametrize("index", ["1", "100", "ab", "\u0661\u0662"])
def test_the_index_is_two_ascii_digits(index: str) -> None:
    with pytest.raises(ValueError, match="two digits"):
        plugin.check_index(index)


def test_the_plugin_runs_on_debians_python3_protobuf() -> None:
    """The .deb runs on Debian 12's python3-protobuf (3.21, Python module 4.21), not the venv's:
    the plugin answers Configure and a CreateContainer (a container with no GPU request) there."""
    code = (
        "import google.protobuf as g\n"
        "from gpuhook.nri import nri_api_pb2 as a, plugin, wire, ttrpc_pb2 as t\n"
        "p = plugin.Plugin('/x', '10', load_config=lambda: None, log=lambda e, **f: None)\n"
        "def call(method, body, stream):\n"
        "    raw = t.Request(service=plugin.PLUGIN_SERVICE, method=method,\n"
        "                    payload=body.SerializeToString()).SerializeToString()\n"
        "    (m,) = wire.Reader().feed(p.answer(wire.Message(1, stream, 1, 0, raw)))\n"
        "    return t.Response.FromString(m.payload)\n"
        "c = call('Configure', a.ConfigureRequest(runtime_name='containerd'), 1)\n"
        "req = a.CreateContainerRequest(pod=a.PodSandbox(uid='u'),\n"
        "                               container=a.Container(id='c', env=['PATH=/bin']))\n"
        "r = call('CreateContainer', req, 3)\n"
        "adj = a.CreateContainerResponse.FromString(r.payload).adjust\n"
        "print(g.__version__, a.ConfigureResponse.FromString(c.payload).events,\n"
        "      r.status.code, adj.ByteSize())\n"
    )
    src = str(plugin.__file__).rsplit("/gpuhook/", 1)[0]
    out = subprocess.run(
        ["/usr/bin/python3", "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": src},
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["4.21.12", str(plugin.EVENTS), "0", "0"]


def test_a_split_synchronize_is_collected_and_answered_once() -> None:
    """NRI splits a large Synchronize into messages with `more` set: each is acknowledged with
    `more`, and the containers of all of them are handled with the last one."""
    from gpuhook.errors import ConfigError

    seen: list[Any] = []

    def load() -> Any:
        seen.append("config read")
        raise ConfigError("/nonexistent.yaml", "no config here")

    def note(event: str, **_fields: Any) -> None:
        seen.append(event)

    p = plugin.Plugin("/nonexistent", "10", load_config=load, log=note)
    first = api.SynchronizeRequest(
        pods=[api.PodSandbox(id="p")], containers=[api.Container(id="a", pod_sandbox_id="p")],
        more=True,
    )  # fmt: skip
    last = api.SynchronizeRequest(containers=[api.Container(id="b", pod_sandbox_id="p")])
    replies = []
    for stream, body in ((1, first), (3, last)):
        raw = _request("Synchronize", body.SerializeToString())
        _, code, _, payload = _status(p.answer(wire.Message(1, stream, wire.REQUEST, 0, raw)))
        assert code == wire.OK
        replies.append(api.SynchronizeResponse.FromString(payload).more)
    assert replies == [True, False]
    assert seen == ["config read", "nri synchronize skipped"]  # once, after the last part
