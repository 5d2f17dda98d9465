"""A device plugin for the real kubelet, answering as NVIDIA's k8s-device-plugin does.

The kubelet's device plugin API (v1beta1, ``deviceplugin_v1beta1.proto``: the kubelet's own
``api.proto``, compiled at test time with grpcio-tools) over gRPC on unix sockets in
``/var/lib/kubelet/device-plugins`` (the kubelet's DevicePluginPath: hard-coded, whatever its
``--root-dir``). One :class:`Plugin` serves one resource: it registers with the kubelet,
lists its devices once through ListAndWatch (all healthy, no topology) and answers Allocate with
what NVIDIA's plugin puts in a ContainerAllocateResponse for its ``DEVICE_LIST_STRATEGY``:

- ``envvar`` (its default): ``NVIDIA_VISIBLE_DEVICES=<uuid>,...`` in ``envs``;
- ``volume-mounts``: a mount of ``/dev/null`` at ``/var/run/nvidia-container-devices/<uuid>``
  per device and ``NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices``;
- ``cdi-annotations``: one annotation ``cdi.k8s.io/nvidia-device-plugin_<random uuid>`` naming
  ``nvidia.com/gpu=<uuid>,...``.

Device ids are GPU UUIDs (``deviceIDStrategy: uuid``, the default); a shared resource
(time-slicing, MPS) lists ``replicas`` ids ``<uuid>::<n>`` per GPU, and Allocate names the GPU
behind the replicas it was given, as NVIDIA's plugin does. Every Allocate is recorded.
"""

from __future__ import annotations

import threading
import uuid as uuidlib
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from tests.integration.cri import client as cri_client

PROTO = Path(__file__).with_name("deviceplugin_v1beta1.proto")
PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")  # pluginapi.DevicePluginPath
KUBELET_SOCKET = PLUGIN_DIR / "kubelet.sock"
VERSION = "v1beta1"
MARKER_ROOT = "/var/run/nvidia-container-devices"
STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations")
RPC_TIMEOUT = 30.0


def compile_api(out: Path) -> ModuleType:
    """The v1beta1 messages (``deviceplugin_v1beta1_pb2``), compiled into ``out``."""
    return cri_client.compile_api(out, PROTO)


@dataclass(frozen=True)
class Resource:
    """One extended resource: its name, the GPUs behind it, the plugin's list strategy and, for
    a shared resource, the number of replicas of each GPU."""

    name: str
    uuids: tuple[str, ...]
    strategy: str = "envvar"
    replicas: int = 0

    def device_ids(self) -> list[str]:
        if not self.replicas:
            return list(self.uuids)
        return [f"{u}::{n}" for u in self.uuids for n in range(self.replicas)]

    @property
    def endpoint(self) -> str:
        """The socket's name in PLUGIN_DIR (the kubelet dials it there)."""
        return "gpuhook-test-" + self.name.replace("/", "_") + ".sock"


@dataclass(frozen=True)
class Allocated:
    """One container's part of an Allocate call, as the plugin saw and answered it."""

    resource: str
    device_ids: tuple[str, ...]
    response: Any  # ContainerAllocateResponse


def gpus_of(device_ids: list[str] | tuple[str, ...]) -> list[str]:
    """The GPU UUIDs behind device ids, replica suffixes dropped, in order, once each."""
    out: list[str] = []
    for device in device_ids:
        uuid = device.partition("::")[0]
        if uuid not in out:
            out.append(uuid)
    return out


def container_response(api: ModuleType, strategy: str, device_ids: list[str]) -> Any:
    """What NVIDIA's plugin answers for one container under ``strategy``."""
    uuids = gpus_of(device_ids)
    if strategy == "envvar":
        return api.ContainerAllocateResponse(envs={"NVIDIA_VISIBLE_DEVICES": ",".join(uuids)})
    if strategy == "volume-mounts":
        mounts = [
            api.Mount(container_path=f"{MARKER_ROOT}/{u}", host_path="/dev/null") for u in uuids
        ]
        return api.ContainerAllocateResponse(
            envs={"NVIDIA_VISIBLE_DEVICES": MARKER_ROOT}, mounts=mounts
        )
    if strategy == "cdi-annotations":
        key = f"cdi.k8s.io/nvidia-device-plugin_{uuidlib.uuid4()}"
        names = ",".join(f"nvidia.com/gpu={u}" for u in uuids)
        return api.ContainerAllocateResponse(annotations={key: names})
    raise ValueError(f"unknown device list strategy {strategy!r}")


class Plugin:
    """A running device plugin server for one resource, registered with the kubelet."""

    def __init__(self, api: ModuleType, resource: Resource) -> None:
        import grpc  # type: ignore[import-untyped]

        self.api = api
        self.resource = resource
        self.socket = PLUGIN_DIR / resource.endpoint
        self.allocated: list[Allocated] = []
        self.watching = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        services = cri_client.services(api)
        services.add_DevicePluginServicer_to_server(_Servicer(self), self.server)
        self.server.add_insecure_port(f"unix://{self.socket}")
        self.server.start()

    def register(self) -> None:
        """Register with the kubelet (Registration.Register on its socket)."""
        import grpc

        request = self.api.RegisterRequest(
            version=VERSION,
            endpoint=self.resource.endpoint,
            resource_name=self.resource.name,
            options=self.api.DevicePluginOptions(),
        )
        with grpc.insecure_channel(f"unix://{KUBELET_SOCKET}") as channel:
            stub = cri_client.services(self.api).RegistrationStub(channel)
            stub.Register(request, timeout=RPC_TIMEOUT)

    def allocations(self) -> list[Allocated]:
        with self._lock:
            return list(self.allocated)

    def stop(self) -> None:
        """End ListAndWatch, stop serving and remove the socket."""
        self._stop.set()
        self.server.stop(grace=None).wait(RPC_TIMEOUT)
        self.socket.unlink(missing_ok=True)

    # --- the servicer's side ----------------------------------------------------------------

    def list_and_watch(self) -> Iterator[Any]:
        devices = [self.api.Device(ID=i, health="Healthy") for i in self.resource.device_ids()]
        yield self.api.ListAndWatchResponse(devices=devices)
        self.watching.set()
        self._stop.wait()

    def allocate(self, request: Any) -> Any:
        responses = []
        for container in request.container_requests:
            ids = list(container.devices_ids)
            answer = container_response(self.api, self.resource.strategy, ids)
            with self._lock:
                self.allocated.append(Allocated(self.resource.name, tuple(ids), answer))
            responses.append(answer)
        return self.api.AllocateResponse(container_responses=responses)


class _Servicer:
    """The DevicePlugin service of one :class:`Plugin` (the generated servicer's methods)."""

    def __init__(self, plugin: Plugin) -> None:
        self.plugin = plugin

    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return self.plugin.api.DevicePluginOptions()

    def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:
        yield from self.plugin.list_and_watch()

    def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        return self.plugin.api.PreferredAllocationResponse()

    def Allocate(self, request: Any, context: Any) -> Any:
        return self.plugin.allocate(request)

    def PreStartContainer(self, request: Any, context: Any) -> Any:
        return self.plugin.api.PreStartContainerResponse()
