"""The inventory as a CDI spec (kind ``nvidia.com/gpu``), for engines that resolve CDI devices
themselves (podman, CRI-O, containerd 2.x with ``enable_cdi``).

One device per GPU and per MIG device, each under its index (``0``, ``<gpu>:<mig>`` such as
``2:0``) and its UUID, plus ``all``. A device's edits are its device nodes (a MIG device: its
GPU's node and its nvidia-caps nodes) and its volume-mount marker (``/dev/null`` at
``/var/run/nvidia-container-devices/<uuid>``), so that gpuhook, when it is also the engine's
runtime, sees which devices the engine injected and records them instead of injecting them
again. The common edits hold what :mod:`gpuhook.pipeline.inject` gives a granted container (one
owner: :mod:`gpuhook.pipeline.driverfiles`): the control nodes, the driver libraries (with their
development links), binaries and graphics files of the configured capabilities, firmware, IPC
sockets and gpuhook's ``update-ldcache`` createContainer hook, which here also decides about an
image's CUDA forward compatibility libraries itself (``--cuda-compat``: no image is known yet).
The spec is validated against the CDI JSON schema shipped in ``gpuhook/schemas`` and written
atomically.

The CDI spec front end (docs/architecture.md, "Layers and front ends"): no container, so no
``Request``; :func:`spec` is its translation point, where the core's edits of every device
(:func:`common_edits`, :func:`devices`) become CDI ``containerEdits`` (:func:`_cdi_edits`).
"""

from __future__ import annotations

import json
import os
from importlib import resources
from typing import TYPE_CHECKING, NamedTuple

import jsonschema
import yaml

from gpuhook.errors import CdiError
from gpuhook.fsutil import atomic_write
from gpuhook.model.edits import ContainerEdits, Hook, Mount
from gpuhook.pipeline import driverfiles, inject
from gpuhook.pipeline.request import ENV_VISIBLE, MARKER_ROOTS, MARKER_SOURCE

if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

    from gpuhook.config.types import Config
    from gpuhook.model.inventory import DeviceNode, Gpu, Inventory, MigDevice

CDI_VERSION = "0.5.0"  # podman 4.3 (CDI 0.5.x) reads 0.3.0 to 0.5.0; 0.5.0 brings hostPath
KIND = "nvidia.com/gpu"
MARKER_OPTIONS = ("ro", "nosuid", "nodev", "bind")


class Device(NamedTuple):
    """One CDI device: its names (index and UUID, or ``all``), its edits, what it is."""

    names: tuple[str, ...]
    edits: ContainerEdits
    what: str


def devices(inventory: Inventory) -> list[Device]:
    """Every GPU and MIG device under its index and UUID, then ``all`` (pure)."""
    out: list[Device] = []
    for gpu in inventory.gpus:
        if gpu.node is not None:
            out.append(Device((str(gpu.index), gpu.uuid), _edits([gpu.node], gpu.uuid), gpu.name))
            out += [_mig_device(gpu, gpu.node, mig) for mig in gpu.mig_devices]
    nodes = [n for d in out for n in d.edits.device_nodes]
    out.append(Device(("all",), _edits(nodes, "all"), "every device above"))
    return out


def _mig_device(gpu: Gpu, node: DeviceNode, mig: MigDevice) -> Device:
    names = (f"{gpu.index}:{mig.index}", mig.uuid)
    return Device(names, _edits([node, *mig.caps], mig.uuid), mig.name)


def _edits(nodes: Iterable[DeviceNode], marker: str) -> ContainerEdits:
    unique = {n.path: n for n in nodes}
    mount = Mount(MARKER_SOURCE, MARKER_ROOTS[0] + marker, "bind", MARKER_OPTIONS)
    return ContainerEdits(device_nodes=tuple(unique.values()), mounts=(mount,))


def common_edits(inventory: Inventory, config: Config) -> ContainerEdits:
    """What every device of the spec brings: control nodes, driver files, the ld.so.cache hook.

    ``NVIDIA_VISIBLE_DEVICES=void`` keeps other NVIDIA components from acting on the image's
    value; gpuhook-runtime sets the granted devices there itself."""
    caps = frozenset(config.cdi_capabilities)
    # Per-file binds: the spec outlives a driver's prepared folders (it is written once).
    files = driverfiles.driver_files(inventory, config, caps, prepared=False)
    hooks: tuple[Hook, ...] = ()
    if files.folders:
        compat = cuda_compat_arg(inventory) if "compute" in caps and config.cuda_compat else ""
        hooks = (inject.ldcache_hook(config, files.folders, "", files.links, compat),)
    return ContainerEdits(
        env=(f"{ENV_VISIBLE}=void", *files.env),
        device_nodes=tuple(driverfiles.control_nodes(inventory, caps)),
        mounts=files.mounts,
        hooks=hooks,
    )


def cuda_compat_arg(inventory: Inventory) -> str:
    """``DRIVER_VERSION:BRAND[,BRAND...]`` for the hook's ``--cuda-compat``: the host driver and
    the brands of the node's GPUs (a device of the spec may be any of them)."""
    brands = sorted({g.brand for g in inventory.gpus})
    return f"{inventory.driver_version}:{','.join(str(b) for b in brands)}"


def spec(inventory: Inventory, config: Config) -> dict[str, Any]:
    """The CDI spec of the inventory (pure)."""
    return {
        "cdiVersion": CDI_VERSION,
        "kind": KIND,
        "devices": [
            {"name": name, "containerEdits": _cdi_edits(d.edits)}
            for d in devices(inventory)
            for name in d.names
        ],
        "containerEdits": _cdi_edits(common_edits(inventory, config)),
    }


def _cdi_edits(edits: ContainerEdits) -> dict[str, Any]:
    """``containerEdits`` as CDI has them: no empty lists, device nodes without a file mode, no
    notes."""
    out = edits.to_dict()
    out.pop("notes", None)
    for node in out["deviceNodes"]:
        del node["fileMode"]
    return {key: value for key, value in out.items() if value}


def validate(data: Any) -> None:
    """Check ``data`` against the CDI JSON schema (shipped in ``gpuhook/schemas``)."""
    errors = sorted(jsonschema.Draft7Validator(cdi_schema()).iter_errors(data), key=str)
    if errors:
        where = "/".join(str(p) for p in errors[0].absolute_path) or "(top)"
        raise CdiError(f"the CDI spec is invalid at {where}: {errors[0].message}")


DEFS_REF = "defs.json#"


def cdi_schema() -> dict[str, Any]:
    """The CDI schema as one document: ``cdi.defs.json``'s definitions merged in, its
    ``defs.json#/...`` references made local (``#/...``). Any jsonschema version resolves it
    (Debian 12's 4.10 has no ``referencing``; ``RefResolver`` is deprecated since 4.18)."""
    schema: dict[str, Any] = _local_refs(_schema("cdi.schema.json"))
    definitions = _schema("cdi.defs.json")["definitions"]
    if set(definitions) & set(schema.get("definitions", {})):
        raise ValueError("cdi.defs.json and cdi.schema.json define the same name")
    schema["definitions"] = {**definitions, **schema.get("definitions", {})}
    return schema


def _local_refs(node: Any) -> Any:
    """``node`` with every ``$ref`` into ``defs.json`` pointing into the document itself."""
    if isinstance(node, dict):
        out = {k: _local_refs(v) for k, v in node.items()}
        ref = out.get("$ref")
        if isinstance(ref, str) and ref.startswith(DEFS_REF):
            out["$ref"] = "#" + ref[len(DEFS_REF) :]
        return out
    if isinstance(node, list):
        return [_local_refs(v) for v in node]
    return node


def _schema(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(
        resources.files("gpuhook").joinpath(f"schemas/{name}").read_bytes()
    )
    return loaded


def load(path: str) -> Any:
    """A CDI spec file, JSON or YAML by its name. Raises OSError, ValueError."""
    with open(path, "rb") as fh:
        raw = fh.read()
    if format_for(path) == "yaml":
        try:
            return yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise ValueError(f"not valid YAML: {exc}") from None
    return json.loads(raw)


def render(data: dict[str, Any], fmt: str) -> bytes:
    """The spec as JSON or YAML text."""
    if fmt == "yaml":
        return yaml.safe_dump(data, sort_keys=False).encode()
    return json.dumps(data, indent=2).encode() + b"\n"


def format_for(path: str) -> str:
    """``yaml`` for a ``.yaml``/``.yml`` file name, else ``json`` (what CDI readers expect)."""
    return "yaml" if path.endswith((".yaml", ".yml")) else "json"


def write(data: dict[str, Any], path: str, fmt: str | None = None) -> None:
    """Validate ``data`` and write it to ``path`` atomically (mode 0644, folder made)."""
    validate(data)
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        atomic_write(path, render(data, fmt or format_for(path)), 0o644)
    except OSError as exc:
        raise CdiError(f"cannot write CDI spec {path}: {exc.strerror}") from None


class Conflict(NamedTuple):
    """Another CDI spec in the engines' folders that names some of the same devices."""

    path: str
    names: tuple[str, ...]  # the device names both specs define, of kind nvidia.com/gpu
    same_folder: bool  # True: engines refuse both; False: the later folder's spec hides the other

    def line(self) -> str:
        shown = ", ".join(f"{KIND}={n}" for n in self.names[:3])
        more = f" and {len(self.names) - 3} more" if len(self.names) > 3 else ""
        if self.same_folder:
            what = "engines that read both refuse these devices (conflicting device)"
        else:
            what = "engines take the spec of the later folder of cdi.spec_dirs and hide the other's"
        return f"{self.path} also defines {shown}{more}: {what}"


CONFLICT_FIX = (
    "keep one spec of kind nvidia.com/gpu: remove the other (nvidia-ctk's nvidia.yaml: also stop "
    'its nvidia-cdi-refresh service), or set cdi.output to "" in gpuhook\'s config'
)


def conflicts(data: dict[str, Any], output: str, folders: Iterable[str]) -> list[Conflict]:
    """When ``output`` is in one of the engines' spec ``folders``: the spec files there other
    than ``output`` whose devices of kind nvidia.com/gpu share a name with ``data``'s (a spec
    written elsewhere is read by no engine, and conflicts with nothing). Unreadable files are
    skipped, as engines skip them."""
    ours = {d["name"] for d in data["devices"]}
    home = os.path.realpath(os.path.dirname(os.path.abspath(output)))
    target = os.path.realpath(output)
    dirs = _unique_real(folders)
    if home not in dirs:
        return []
    found = []
    for folder in dirs:
        for path in _spec_files(folder):
            if os.path.realpath(path) == target:
                continue
            names = ours & _device_names(path)
            if names:
                found.append(Conflict(path, tuple(sorted(names)), folder == home))
    return found


def _unique_real(folders: Iterable[str]) -> list[str]:
    out: list[str] = []
    for folder in folders:
        real = os.path.realpath(folder)
        if real not in out:
            out.append(real)
    return out


def _spec_files(folder: str) -> list[str]:
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    return [os.path.join(folder, n) for n in names if n.endswith((".json", ".yaml", ".yml"))]


def _device_names(path: str) -> set[str]:
    """The device names of a spec of kind nvidia.com/gpu (empty for another kind or a bad file)."""
    try:
        other = load(path)
    except (OSError, ValueError):
        return set()
    if not isinstance(other, dict) or other.get("kind") != KIND:
        return set()
    listed = other.get("devices")
    entries = listed if isinstance(listed, list) else []
    return {d["name"] for d in entries if isinstance(d, dict) and isinstance(d.get("name"), str)}


def export(inventory: Inventory, config: Config) -> tuple[str, list[Conflict]]:
    """Regenerate the spec at ``cdi.output`` unless another spec in ``cdi.spec_dirs`` names the
    same devices (then nothing is written, and the conflicts say why). Returns the path written
    ("" when none) and the conflicts."""
    if not config.cdi_output:
        return "", []
    data = spec(inventory, config)
    found = conflicts(data, config.cdi_output, config.cdi_spec_dirs)
    if found:
        return "", found
    write(data, config.cdi_output)
    return config.cdi_output, []
