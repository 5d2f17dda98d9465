"""The plugin's lifecycle: connect to the engine's NRI socket, register, serve, reconnect.

One connection at a time, served by one thread: register (``RegisterPlugin`` with the name
``gpuhook`` and a two-digit index: plugins are called in index order), then answer the engine's
calls in the order they come: ``Configure`` (subscribe to CreateContainer, StopContainer and
RemoveContainer), ``Synchronize`` (the engine's containers: records rebuilt),
``CreateContainer`` (the core's decision as an adjustment, or a refusal of one line),
``StopContainer`` (MPS admission stops counting it), ``RemoveContainer`` (its record removed),
``Shutdown``. A call of another method, a payload that does not decode, a request on an even
stream get a ttrpc error status; a frame over the protocol's limits closes the connection. When
the engine closes it (a restart), the plugin connects again, with a growing pause, for ever.
"""

from __future__ import annotations

import socket
import time

from gpuhook.errors import GpuhookError, describe
from gpuhook.nri import defaults, translate, wire
from gpuhook.nri import nri_api_pb2 as api
from gpuhook.nri import ttrpc_pb2 as ttrpc

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from gpuhook.config.types import Config

DEFAULT_SOCKET = defaults.SOCKET
NAME = defaults.NAME
DEFAULT_INDEX = defaults.INDEX
PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
REGISTER_STREAM = 1
REGISTER_TIMEOUT_S = 5.0
EVENTS = sum(1 << (e - 1) for e in (api.CREATE_CONTAINER, api.STOP_CONTAINER, api.REMOVE_CONTAINER))
RETRY_S = (0.2, 0.5, 1.0, 2.0)


class Refused(Exception):
    """A call answered with an error status; ``str()`` is its one line."""

    def __init__(self, message: str, code: int = wire.UNKNOWN) -> None:
        super().__init__(message)
        self.code = code


class Closed(Exception):
    """The session ended (the engine closed it, said Shutdown, or broke the protocol)."""


def check_index(index: str) -> str:
    """NRI's rule: exactly two digits. Raises ValueError."""
    return defaults.check_index(index)


class Plugin:
    """gpuhook's NRI plugin on ``socket_path``. ``load_config`` gives gpuhook's config (read per
    call, as the shim reads it per create); ``log`` takes an event and its fields."""

    def __init__(
        self,
        socket_path: str = DEFAULT_SOCKET,
        index: str = DEFAULT_INDEX,
        *,
        load_config: Callable[[], Config],
        log: Callable[..., None],
    ) -> None:
        self.socket_path = socket_path
        self.index = check_index(index)
        self.load_config = load_config
        self.log = log
        self.runtime = "containerd"
        self.sessions = 0
        self._sync: list[tuple[api.PodSandbox, api.Container]] = []
        self._pods: dict[str, api.PodSandbox] = {}
        self._sock: socket.socket | None = None
        self._handlers: dict[str, Callable[[bytes], Any]] = {
            "Configure": self._configure,
            "Synchronize": self._synchronize,
            "Shutdown": self._shutdown,
            "CreateContainer": self._create,
            "StopContainer": self._stop,
            "RemoveContainer": self._remove,
        }

    # --- connections --------------------------------------------------------------------

    def run_forever(self, stop: Callable[[], bool] = lambda: False) -> None:
        """Serve sessions until ``stop()`` says so, reconnecting after each."""
        failures = 0
        while not stop():
            try:
                self.session()
                failures = 0
            except (OSError, Closed, wire.FrameError) as exc:
                self.log("nri session ended", error=str(exc) or type(exc).__name__)
                failures += 1
            time.sleep(RETRY_S[min(failures, len(RETRY_S) - 1)])

    def session(self) -> None:
        """One connection: register, then serve until the engine closes it. Raises Closed,
        OSError (cannot connect), wire.FrameError."""
        self._warm()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self._sock = sock
        try:
            sock.settimeout(REGISTER_TIMEOUT_S)
            sock.connect(self.socket_path)
            self.sessions += 1
            self._register(sock)
            self._serve(sock, wire.Reader(), registered=False)
        finally:
            self._sock = None
            sock.close()

    def _warm(self) -> None:
        """Bring the inventory up to date before registering: a create must not pay for an
        NVML refresh inside NRI's request timeout (2 s, after which the engine drops the
        plugin). Best effort: a create refreshes it itself when it must."""
        from gpuhook.runtime import decide

        try:
            decide.inventory(self.load_config())
        except GpuhookError as exc:
            self.log("inventory not ready", error=str(exc))

    def close(self) -> None:
        """End the current session (from another thread: a test, a signal)."""
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _register(self, sock: socket.socket) -> None:
        body = api.RegisterPluginRequest(plugin_name=NAME, plugin_idx=self.index)
        call = ttrpc.Request(
            service=RUNTIME_SERVICE,
            method="RegisterPlugin",
            payload=body.SerializeToString(),
            timeout_nano=int(REGISTER_TIMEOUT_S * 1e9),
        )
        sock.sendall(
            wire.frame(wire.RUNTIME_CONN, REGISTER_STREAM, wire.REQUEST, call.SerializeToString())
        )

    def _serve(self, sock: socket.socket, reader: wire.Reader, registered: bool) -> None:
        while True:
            data = sock.recv(1 << 16)
            if not data:
                raise Closed("the engine closed the NRI connection")
            for msg in reader.feed(data):
                if msg.conn == wire.RUNTIME_CONN:
                    registered = self._runtime_reply(msg) or registered
                    if registered:
                        sock.settimeout(None)
                elif msg.type == wire.REQUEST:
                    sock.sendall(self.answer(msg))

    def _runtime_reply(self, msg: wire.Message) -> bool:
        """The engine's answer to RegisterPlugin: True when it registered us. Raises Closed."""
        if msg.type != wire.RESPONSE or msg.stream != REGISTER_STREAM:
            return False
        try:
            status = ttrpc.Response.FromString(msg.payload).status
        except Exception as exc:
            raise Closed(f"undecodable RegisterPlugin reply: {exc}") from None
        if status.code != wire.OK:
            raise Closed(f"the engine refused the registration: {status.message}")
        self.log("nri registered", plugin=f"{self.index}-{NAME}", socket=self.socket_path)
        self._announce()
        return True

    def _announce(self) -> None:
        from gpuhook.nri import state

        try:
            state.announce(self.load_config(), self.socket_path, f"{self.index}-{NAME}")
        except Exception as exc:  # best effort: doctor's view, never the plugin's work
            self.log("nri status not written", error=describe(exc)[1])

    def retire(self) -> None:
        """The plugin stops: ``gpuhook doctor`` no longer sees it."""
        from gpuhook.nri import state

        try:
            state.retire(self.load_config())
        except GpuhookError:
            pass

    # --- calls --------------------------------------------------------------------------

    def answer(self, msg: wire.Message) -> bytes:
        """The response frame for one request of the engine's (never raises)."""
        reply = ttrpc.Response()
        try:
            if msg.stream % 2 == 0:
                raise Refused("StreamID must be odd for client initiated streams", 3)
            payload = self.call(msg.payload)
            reply.payload = payload
        except Refused as exc:
            reply.status.code = exc.code
            reply.status.message = str(exc)
        return wire.frame(wire.PLUGIN_CONN, msg.stream, wire.RESPONSE, reply.SerializeToString())

    def call(self, raw: bytes) -> bytes:
        """One ttrpc request's answer payload. Raises Refused."""
        try:
            req = ttrpc.Request.FromString(raw)
        except Exception as exc:
            raise Refused(f"unmarshal request error: {exc}", wire.INVALID_ARGUMENT) from None
        handler = self._handlers.get(req.method) if req.service == PLUGIN_SERVICE else None
        if handler is None:
            raise Refused(f"{req.service}.{req.method} is not implemented", wire.UNIMPLEMENTED)
        try:
            out: bytes = handler(req.payload).SerializeToString()
        except Refused:
            raise
        except Exception as exc:
            if type(exc).__name__ == "DecodeError":
                raise Refused(f"{req.method}: {exc}", wire.INVALID_ARGUMENT) from None
            line = describe(exc)[1]
            self.log("nri call failed", method=req.method, error=line)
            raise Refused(f"gpuhook: {line}") from None
        return out

    def _configure(self, raw: bytes) -> api.ConfigureResponse:
        req = api.ConfigureRequest.FromString(raw)
        self.runtime = "cri-o" if "cri-o" in req.runtime_name.lower() else "containerd"
        self.log(
            "nri configured",
            runtime=f"{req.runtime_name} {req.runtime_version}",
            request_timeout_ms=req.request_timeout,
        )
        return api.ConfigureResponse(events=EVENTS)

    def _shutdown(self, raw: bytes) -> api.Empty:
        api.Empty.FromString(raw)
        self.log("nri shutdown requested")
        return api.Empty()

    def _synchronize(self, raw: bytes) -> api.SynchronizeResponse:
        req = api.SynchronizeRequest.FromString(raw)
        self._pods.update({p.id: p for p in req.pods})
        self._sync += [
            (self._pods.get(c.pod_sandbox_id, api.PodSandbox()), c) for c in req.containers
        ]
        if req.more:
            return api.SynchronizeResponse(more=True)
        containers, self._sync = self._sync, []
        from gpuhook.nri import create

        create.synchronize(self.load_config, self.runtime, containers, self.log)
        return api.SynchronizeResponse()

    def _create(self, raw: bytes) -> api.CreateContainerResponse:
        req = api.CreateContainerRequest.FromString(raw)
        self._pods[req.pod.id] = req.pod
        from gpuhook.nri import create

        try:
            adjust = create.adjust(self.load_config, self.runtime, req.pod, req.container, self.log)
        except GpuhookError as exc:
            raise Refused(f"gpuhook: {describe(exc)[1]}") from None
        except translate.Unadjustable as exc:
            raise Refused(f"gpuhook: {exc}") from None
        return api.CreateContainerResponse(adjust=adjust)

    def _stop(self, raw: bytes) -> api.StopContainerResponse:
        req = api.StopContainerRequest.FromString(raw)
        from gpuhook.nri import state

        try:
            state.set_live(self.load_config(), req.container.id, live=False)
        except GpuhookError:
            pass
        return api.StopContainerResponse()

    def _remove(self, raw: bytes) -> api.RemoveContainerResponse:
        req = api.RemoveContainerRequest.FromString(raw)
        from gpuhook.nri import state

        try:
            state.forget(self.load_config(), req.container.id)
        except GpuhookError:
            pass
        return api.RemoveContainerResponse()
