"""A decision record as its readers see it: read once, checked, typed.

The JSON form on disk is ``schemas/record.schema.json`` (written by
:mod:`gpuhook.records.writer`); :meth:`Record.from_dict` reads it into these values, raising
ValueError with one line for anything that is not a record of this version. Every reader (lookup,
gc, MPS admission, ``gpuhook inspect``, the self test) uses this model and never the raw dict;
``Record.data`` keeps the JSON as read for ``--output json``.

Records written by earlier gpuhook versions read as well: their MPS limits without a
reservation (``counted`` instead), without the client's uid or the per-process note.
"""

from __future__ import annotations

from gpuhook.model.decision import Decision, KubeIdentity, Request
from gpuhook.model.edits import ContainerEdits
from gpuhook.model.fields import _get, _objs, _opt, _strs
from gpuhook.model.frozen import Frozen

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

RECORD_VERSION = 1


class Creator(Frozen):
    """The process that ran the runtime's create (its pid and start time in clock ticks since
    boot): MPS admission counts the container while it lives."""

    pid: int
    start: int

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Creator:
        return cls(_get(d, "pid", int), _get(d, "start", int))


class RuntimeRef(Frozen):
    """The low-level runtime the container was handed to and its ``--root`` ("" for the
    runtime's default). Only the root is ever acted on: readers run the configured runtime,
    never a path read from a file in the bundle."""

    path: str
    root: str
    creator: Creator | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RuntimeRef:
        creator = _opt(d, "creator", dict)
        return cls(
            _get(d, "path", str),
            _get(d, "root", str),
            Creator.from_dict(creator) if creator is not None else None,
        )


class MpsLimit(Frozen):
    """One shared GPU of an MPS client: its index in the container's view, its host GPU, the
    pinned memory limit its processes start with (``pinned`` bytes, ``limit`` as MPS reads it),
    and what it reserves (``reserved``: None in a record written before reservations, which
    counted the pinned bytes when ``counted``)."""

    index: int
    gpu: int
    uuid: str
    limit: str
    source: str
    pinned: int
    reserved: int | None = None
    counted: bool = False

    @property
    def reservation(self) -> int:
        """The bytes this container holds on the GPU for admission (0: none)."""
        if self.reserved is not None:
            return self.reserved
        return self.pinned if self.counted else 0

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MpsLimit:
        return cls(
            _get(d, "index", int),
            _get(d, "gpu", int),
            _get(d, "uuid", str),
            _get(d, "limit", str),
            _get(d, "source", str),
            _get(d, "bytes", int),
            _opt(d, "reserved", int),
            _opt(d, "counted", bool, False),
        )


class MpsView(Frozen):
    """The MPS settings a shared GPU's container got: its group, the pipe folder (host and
    container), the active thread percentage and the pinned limits, with their sources, the
    uid its processes run as on the host (None: not recorded) and the ``CUDA_MPS_*`` variables
    it was given."""

    group: str
    pipe_dir: str
    container_pipe_dir: str
    percentage: int
    percentage_source: str
    limits: tuple[MpsLimit, ...]
    client_uid: int | None = None
    per_process: str = ""
    env: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MpsView:
        pct = _get(d, "active_thread_percentage", dict)
        return cls(
            _get(d, "group", str),
            _get(d, "pipe_dir", str),
            _get(d, "container_pipe_dir", str),
            _get(pct, "value", int),
            _get(pct, "source", str),
            tuple(MpsLimit.from_dict(x) for x in _objs(d, "pinned_memory_limits")),
            _opt(d, "client_uid", int),
            _opt(d, "per_process", str, ""),
            _strs(d, "env"),
        )


class Timing(Frozen):
    """How long a create's decision took (``seconds``, from gpuhook-runtime's entry to the
    record) and who decided (``path``: ``service`` or ``python``)."""

    path: str
    seconds: float

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Timing:
        seconds = _get(d, "seconds", (int, float))
        if isinstance(seconds, bool) or seconds < 0:
            raise ValueError("field 'seconds' is not a duration")
        return cls(_get(d, "path", str), float(seconds))


class DecisionView(Frozen):
    """What was decided and injected for one spec: a record's body, and ``gpuhook inspect
    spec``'s view. ``request`` is None where no spec was parsed."""

    kubernetes: KubeIdentity | None
    request: Request | None
    decision: Decision
    edits: ContainerEdits
    mps: MpsView | None
    spec_changed: bool

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DecisionView:
        kube, req, mps = (_opt(d, key, dict) for key in ("kubernetes", "request", "mps"))
        return cls(
            KubeIdentity.from_dict(kube) if kube is not None else None,
            Request.from_dict(req) if req is not None else None,
            Decision.from_dict(_get(d, "decision", dict)),
            ContainerEdits.from_dict(_opt(d, "edits", dict, {})),
            MpsView.from_dict(mps) if mps is not None else None,
            _opt(d, "spec_changed", bool, False),
        )


class Record(Frozen):
    """One container's decision record. ``data``: the JSON as read (``--output json``)."""

    container_id: str
    bundle: str
    gpuhook_version: str
    timestamp: float
    config: str
    runtime: RuntimeRef
    view: DecisionView
    data: dict[str, Any]
    timing: Timing | None = None  # None in records written before timings

    @property
    def decision(self) -> Decision:
        return self.view.decision

    @property
    def kubernetes(self) -> KubeIdentity | None:
        return self.view.kubernetes

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Record:
        """The record, or ValueError saying what makes ``d`` none (of this version)."""
        version = _get(d, "record_version", int)
        if version != RECORD_VERSION:
            raise ValueError(f"record version {version} (this gpuhook reads {RECORD_VERSION})")
        timestamp = _get(d, "timestamp", (int, float))
        if isinstance(timestamp, bool) or timestamp < 0:
            raise ValueError("field 'timestamp' is not a time")
        return cls(
            _get(d, "container_id", str),
            _get(d, "bundle", str),
            _get(d, "gpuhook_version", str),
            float(timestamp),
            _get(d, "config", str),
            RuntimeRef.from_dict(_get(d, "runtime", dict)),
            DecisionView.from_dict(d),
            dict(d),
            Timing.from_dict(timing) if (timing := _opt(d, "timing", dict)) is not None else None,
        )
