"""A minimal CRI v1 client: the RuntimeService calls the kubelet makes, over gRPC on a unix
socket, with messages compiled at test time from ``runtime_v1_subset.proto`` (grpcio-tools) into
a build folder the caller owns. Nothing generated is kept in the tree."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

PROTO = Path(__file__).with_name("runtime_v1_subset.proto")
RPC_TIMEOUT = 120.0


def compile_api(out: Path, proto: Path = PROTO) -> ModuleType:
    """Compile ``proto`` into ``out`` and import its messages (the ``_grpc`` module imports them
    by their top-level name, so ``out`` goes onto sys.path)."""
    from grpc_tools import protoc  # type: ignore[import-untyped]

    out.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{proto.parent}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        str(proto),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"grpc_tools.protoc failed on {proto}")
    if str(out) not in sys.path:
        sys.path.insert(0, str(out))
    return importlib.import_module(f"{proto.stem}_pb2")


def services(api: ModuleType) -> ModuleType:
    """The gRPC stubs and servicers of a module :func:`compile_api` returned."""
    return importlib.import_module(f"{api.__name__}_grpc")


class CriClient:
    """RuntimeService over ``unix://<socket>``; ``api`` is the compiled messages module."""

    def __init__(self, socket: Path, api: ModuleType) -> None:
        import grpc  # type: ignore[import-untyped]

        self.api = api
        stubs = services(api)
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        self.stub: Any = stubs.RuntimeServiceStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def version(self) -> Any:
        return self.stub.Version(self.api.VersionRequest(version="v1"), timeout=RPC_TIMEOUT)

    def run_pod_sandbox(self, config: Any, runtime_handler: str = "") -> str:
        req = self.api.RunPodSandboxRequest(config=config, runtime_handler=runtime_handler)
        return str(self.stub.RunPodSandbox(req, timeout=RPC_TIMEOUT).pod_sandbox_id)

    def stop_pod_sandbox(self, pod_id: str) -> None:
        self.stub.StopPodSandbox(
            self.api.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=RPC_TIMEOUT
        )

    def remove_pod_sandbox(self, pod_id: str) -> None:
        self.stub.RemovePodSandbox(
            self.api.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=RPC_TIMEOUT
        )

    def create_container(self, pod_id: str, config: Any, sandbox_config: Any) -> str:
        req = self.api.CreateContainerRequest(
            pod_sandbox_id=pod_id, config=config, sandbox_config=sandbox_config
        )
        return str(self.stub.CreateContainer(req, timeout=RPC_TIMEOUT).container_id)

    def start_container(self, container_id: str) -> None:
        self.stub.StartContainer(
            self.api.StartContainerRequest(container_id=container_id), timeout=RPC_TIMEOUT
        )

    def stop_container(self, container_id: str, timeout: int = 0) -> None:
        req = self.api.StopContainerRequest(container_id=container_id, timeout=timeout)
        self.stub.StopContainer(req, timeout=RPC_TIMEOUT)

    def remove_container(self, container_id: str) -> None:
        self.stub.RemoveContainer(
            self.api.RemoveContainerRequest(container_id=container_id), timeout=RPC_TIMEOUT
        )

    def list_pod_sandboxes(self, labels: dict[str, str] | None = None) -> list[Any]:
        """ListPodSandbox: the sandboxes whose labels include ``labels``."""
        flt = self.api.PodSandboxFilter(label_selector=labels or {})
        req = self.api.ListPodSandboxRequest(filter=flt)
        return list(self.stub.ListPodSandbox(req, timeout=RPC_TIMEOUT).items)

    def list_containers(self, labels: dict[str, str] | None = None) -> list[Any]:
        """ListContainers: the containers (any state) whose labels include ``labels``."""
        flt = self.api.ContainerFilter(label_selector=labels or {})
        req = self.api.ListContainersRequest(filter=flt)
        return list(self.stub.ListContainers(req, timeout=RPC_TIMEOUT).containers)

    def container_status(self, container_id: str) -> Any:
        req = self.api.ContainerStatusRequest(container_id=container_id)
        return self.stub.ContainerStatus(req, timeout=RPC_TIMEOUT).status

    def exec_sync(self, container_id: str, cmd: list[str], timeout: int = 30) -> Any:
        """ExecSync as exec probes and `kubectl exec` (non-interactive) use it: exit_code,
        stdout, stderr (bytes)."""
        req = self.api.ExecSyncRequest(container_id=container_id, cmd=cmd, timeout=timeout)
        return self.stub.ExecSync(req, timeout=RPC_TIMEOUT + timeout)
