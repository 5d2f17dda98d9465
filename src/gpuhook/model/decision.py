"""What a container asks for and what it is granted: channels, requests, device references,
reasons and decisions (values only; :mod:`gpuhook.pipeline` computes them).
"""

from __future__ import annotations

from gpuhook.model.fields import _get, _objs, _opt, _strs
from gpuhook.model.frozen import Frozen

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

# --- what a container asks for ------------------------------------------------------------------

# Request channels, in priority order (docs/architecture.md, trust model).
CHANNEL_CDI = "cdi-annotation"
CHANNEL_MOUNT = "mount-marker"
CHANNEL_DOCKER = "docker-gpus"
CHANNEL_ENV = "env"
# Not a request channel: GPU device nodes the engine itself injected (from a CDI spec) before
# gpuhook-runtime ran, found by device number (:mod:`gpuhook.pipeline.engine`).
CHANNEL_ENGINE = "engine-cdi"


class KubeIdentity(Frozen):
    """Who a Kubernetes container is: from the identity annotations containerd or CRI-O wrote,
    or from the kubelet's per-pod mounts (:mod:`gpuhook.pipeline.identity`). ``problem`` says why
    the identity cannot be trusted ("" when it can); such a container is treated as a sandbox."""

    pod_uid: str
    namespace: str
    pod_name: str
    container_name: str
    container_type: str  # "container" | "sandbox" | "unknown"
    source: str = ""  # where the identity comes from: "containerd", "cri-o", "kubelet mounts"
    problem: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "pod_uid": self.pod_uid,
            "namespace": self.namespace,
            "pod_name": self.pod_name,
            "container_name": self.container_name,
            "container_type": self.container_type,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> KubeIdentity:
        """The identity as a record holds it (its source and problem are not recorded)."""
        return cls(
            _get(d, "pod_uid", str),
            _get(d, "namespace", str),
            _get(d, "pod_name", str),
            _get(d, "container_name", str),
            _get(d, "container_type", str),
        )


class ChannelRequest(Frozen):
    """One ask for devices through one channel.

    ``ids`` are the raw device ids as written (``"all"`` and ``"none"`` included); ``source``
    says exactly where (the annotation key, the mount destination, the env variable);
    ``problem`` is why the request is malformed ("" when it is not).
    """

    channel: str
    source: str
    value: str
    ids: tuple[str, ...]
    problem: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "channel": self.channel,
            "source": self.source,
            "value": self.value,
            "ids": list(self.ids),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ChannelRequest:
        return cls(
            _get(d, "channel", str), _get(d, "source", str), _get(d, "value", str), _strs(d, "ids")
        )


class Request(Frozen):
    """What a container's spec asks for, and through which channels. Built by :mod:`request`."""

    channels: tuple[ChannelRequest, ...] = ()
    driver_capabilities: str | None = None
    privileged: bool = False
    kubernetes: KubeIdentity | None = None
    annotations: tuple[tuple[str, str], ...] = ()  # gpuhook.io/* annotations, for later steps
    problems: tuple[str, ...] = ()  # malformed parts of the request, one line each
    # looks like a request but is none (a CDI name of another kind)
    ignored: tuple[Reason, ...] = ()
    # the spec's character devices (path, major, minor) when one is an NVIDIA GPU node (the
    # engine injected it), else empty
    engine_devices: tuple[tuple[str, int, int], ...] = ()

    def annotation(self, key: str) -> str | None:
        for k, v in self.annotations:
            if k == key:
                return v
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "channels": [c.to_dict() for c in self.channels],
            "driver_capabilities": self.driver_capabilities,
            "privileged": self.privileged,
            "kubernetes": self.kubernetes.to_dict() if self.kubernetes else None,
            "annotations": dict(self.annotations),
            "problems": list(self.problems),
            "engine_devices": [
                {"path": p, "major": major, "minor": minor}
                for p, major, minor in self.engine_devices
            ],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Request:
        """The request as a record holds it (what was ignored is in the decision's reasons)."""
        kube = _opt(d, "kubernetes", dict)
        annotations = _opt(d, "annotations", dict, {})
        if not all(isinstance(v, str) for v in annotations.values()):
            raise ValueError("field 'annotations' must map names to strings")
        return cls(
            tuple(ChannelRequest.from_dict(c) for c in _objs(d, "channels")),
            _opt(d, "driver_capabilities", str),
            _get(d, "privileged", bool),
            KubeIdentity.from_dict(kube) if kube is not None else None,
            tuple(annotations.items()),
            _strs(d, "problems"),
            engine_devices=tuple(
                (_get(e, "path", str), _get(e, "major", int), _get(e, "minor", int))
                for e in _objs(d, "engine_devices")
            ),
        )


# --- what gpuhook decides -------------------------------------------------------------------------

KIND_GPU = "gpu"
KIND_MIG = "mig"


class DeviceRef(Frozen):
    """A device resolved against the inventory: a whole GPU or one MIG device."""

    kind: str
    uuid: str
    gpu_index: int
    mig_index: int | None = None

    @property
    def display_id(self) -> str:
        return (
            str(self.gpu_index) if self.mig_index is None else f"{self.gpu_index}:{self.mig_index}"
        )

    def sort_key(self) -> tuple[int, int]:
        return (self.gpu_index, -1 if self.mig_index is None else self.mig_index)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "id": self.display_id, "uuid": self.uuid}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DeviceRef:
        """``{"kind", "id", "uuid"}``: ``id`` is the GPU index, or ``<gpu>:<mig>``."""
        gpu, sep, mig = _get(d, "id", str).partition(":")
        if not gpu.isdigit() or (sep and not mig.isdigit()):
            raise ValueError(f"field 'id' is not a GPU index or <gpu>:<mig> ({d['id']!r})")
        return cls(_get(d, "kind", str), _get(d, "uuid", str), int(gpu), int(mig) if sep else None)


VERDICT_GRANTED = "granted"
VERDICT_REFUSED = "refused"
VERDICT_IGNORED = "ignored"
VERDICT_SUPERSEDED = "superseded"


class Reason(Frozen):
    """One line of the decision's explanation: which channel, which value, what and why."""

    channel: str
    value: str
    verdict: str
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "channel": self.channel,
            "value": self.value,
            "verdict": self.verdict,
            "why": self.why,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Reason:
        verdict = _get(d, "verdict", str)
        return cls(_get(d, "channel", str), _get(d, "value", str), verdict, _get(d, "why", str))


class Decision(Frozen):
    """Which devices a container gets, and why.

    ``gpu_container`` is False when the spec carried no request at all (the container is left
    alone). ``driver_only`` is the ``none`` request: driver files, no devices. ``refused`` is True
    when a request existed but nothing of it was trusted; the shim then sets
    ``NVIDIA_VISIBLE_DEVICES=void`` so that no other NVIDIA component acts on it.
    """

    gpu_container: bool
    devices: tuple[DeviceRef, ...] = ()
    driver_only: bool = False
    capabilities: tuple[str, ...] = ()
    channel: str | None = None
    reasons: tuple[Reason, ...] = ()
    refused: bool = False

    @property
    def injects(self) -> bool:
        """True when the container gets driver files (devices or ``none``)."""
        return bool(self.devices) or self.driver_only

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu_container": self.gpu_container,
            "devices": [d.to_dict() for d in self.devices],
            "driver_only": self.driver_only,
            "capabilities": list(self.capabilities),
            "channel": self.channel,
            "refused": self.refused,
            "reasons": [r.to_dict() for r in self.reasons],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Decision:
        return cls(
            _get(d, "gpu_container", bool),
            tuple(DeviceRef.from_dict(x) for x in _objs(d, "devices")),
            _get(d, "driver_only", bool),
            _strs(d, "capabilities"),
            _opt(d, "channel", str),
            tuple(Reason.from_dict(r) for r in _objs(d, "reasons")),
            _get(d, "refused", bool),
        )
