"""What gets injected, in the CDI ``containerEdits`` shape: device nodes, mounts, hooks, env."""

from __future__ import annotations

from gpuhook.model.fields import _get, _objs, _opt, _strs
from gpuhook.model.frozen import Frozen

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from gpuhook.model.inventory import DeviceNode

# --- what gets injected: CDI containerEdits shape ----------------------------------------------


class Mount(Frozen):
    host_path: str
    container_path: str
    type: str = "bind"
    options: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "hostPath": self.host_path,
            "containerPath": self.container_path,
            "type": self.type,
            "options": list(self.options),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Mount:
        return cls(
            _get(d, "hostPath", str),
            _get(d, "containerPath", str),
            _get(d, "type", str),
            _strs(d, "options"),
        )


class Hook(Frozen):
    hook_name: str
    path: str
    args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    timeout: int | None = None

    def to_oci(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "args": list(self.args), "env": list(self.env)}
        if self.timeout is not None:
            out["timeout"] = self.timeout
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"hookName": self.hook_name, **self.to_oci()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Hook:
        return cls(
            _get(d, "hookName", str),
            _get(d, "path", str),
            _strs(d, "args"),
            _strs(d, "env"),
            _opt(d, "timeout", int),
        )


class Note(Frozen):
    """Why an edit is there (or why one is not): ``what`` names it, ``why`` says the reason, for
    ``gpuhook inspect`` and the decision record. Not an edit itself."""

    what: str
    why: str

    def to_dict(self) -> dict[str, str]:
        return {"what": self.what, "why": self.why}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Note:
        return cls(_get(d, "what", str), _get(d, "why", str))


class ContainerEdits(Frozen):
    """The edits to make to a spec, in the shape of CDI's ``containerEdits``.

    gpuhook's two additions: ``remove_hooks``, basenames of prestart hook executables to drop
    (docker's ``nvidia-container-runtime-hook`` for ``--gpus``, whose work gpuhook has done), and
    ``replace_mounts``, destinations whose existing spec mounts give way to gpuhook's mount there
    (the container's own ``/dev/shm`` when the MPS shm is mounted instead). ``engine_injected``
    is no edit but a note for the record: the UUIDs of the granted devices whose nodes the engine
    had already put into the spec (from gpuhook's CDI spec), so none of it was added again.
    ``notes``, no edit either: the reasons of the driver edits (development links, CUDA forward
    compatibility, graphics files, the modeset node) for ``gpuhook inspect``.
    """

    env: tuple[str, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()
    hooks: tuple[Hook, ...] = ()
    remove_hooks: tuple[str, ...] = ()
    replace_mounts: tuple[str, ...] = ()
    engine_injected: tuple[str, ...] = ()
    notes: tuple[Note, ...] = ()

    def is_empty(self) -> bool:
        return not (
            self.env
            or self.device_nodes
            or self.mounts
            or self.hooks
            or self.remove_hooks
            or self.replace_mounts
        )

    def to_dict(self) -> dict[str, Any]:
        """The CDI ``containerEdits`` JSON form (plus ``removeHooks``/``replaceMounts`` and the
        ``engineInjected`` and ``notes`` annotations when non-empty)."""
        out: dict[str, Any] = {
            "env": list(self.env),
            "deviceNodes": [
                {
                    "path": n.path,
                    "hostPath": n.host_path,
                    "type": n.type,
                    "major": n.major,
                    "minor": n.minor,
                    "fileMode": n.mode,
                    "permissions": "rwm",
                }
                for n in self.device_nodes
            ],
            "mounts": [m.to_dict() for m in self.mounts],
            "hooks": [h.to_dict() for h in self.hooks],
        }
        if self.remove_hooks:
            out["removeHooks"] = list(self.remove_hooks)
        if self.replace_mounts:
            out["replaceMounts"] = list(self.replace_mounts)
        if self.engine_injected:
            out["engineInjected"] = list(self.engine_injected)
        if self.notes:
            out["notes"] = [n.to_dict() for n in self.notes]
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ContainerEdits:
        """The ``containerEdits`` JSON form of :meth:`to_dict` (a decision record's ``edits``)."""
        from gpuhook.model.inventory import DeviceNode

        nodes = tuple(
            DeviceNode(
                _get(n, "path", str),
                _get(n, "hostPath", str),
                _get(n, "major", int),
                _get(n, "minor", int),
                _get(n, "fileMode", int),
                _get(n, "type", str),
            )
            for n in _objs(d, "deviceNodes")
        )
        return cls(
            _strs(d, "env"),
            nodes,
            tuple(Mount.from_dict(m) for m in _objs(d, "mounts")),
            tuple(Hook.from_dict(h) for h in _objs(d, "hooks")),
            _strs(d, "removeHooks"),
            _strs(d, "replaceMounts"),
            _strs(d, "engineInjected"),
            tuple(Note.from_dict(n) for n in _objs(d, "notes")),
        )
