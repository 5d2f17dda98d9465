"""Loading the config: which file (``/etc/gpuhook/config.yaml``, ``GPUHOOK_CONFIG`` for every
executable, or ``--config`` on the CLI), YAML -> ``schemas/config.schema.json`` -> the rules a
schema cannot state -> defaults filled in -> a frozen :class:`~gpuhook.config.types.Config`.

:func:`load` reads the compiled copy (:mod:`gpuhook.config.cache`) while it is current, so the
create path never imports :mod:`yaml` or :mod:`jsonschema`; they are imported only to compile.
"""

from __future__ import annotations

import os

from gpuhook import __version__
from gpuhook.config import cache
from gpuhook.config.types import (
    CDI_KINDS_DEFAULT,
    DEFAULT_PATH,
    ENV_CONFIG,
    GPU_RESOURCES_DEFAULT,
    KUBELET_DIR_DEFAULT,
    Config,
)
from gpuhook.errors import ConfigError
from gpuhook.runtime import locate

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

# The one statement of every default. config/config.yaml.example mirrors it (a test checks).
DEFAULTS: dict[str, Any] = {
    "driver_root": "/",
    "dev_root": "/",
    "state_dir": "/var/lib/gpuhook",
    "runtime": {"path": "", "service": "/run/gpuhook/runtime.sock"},
    "log": {"level": "info", "file": "/var/log/gpuhook/gpuhook.log"},
    "nvml": {"library": ""},
    "inventory": {"path": "", "auto_refresh": True},
    "inject": {
        "lib_dir": "/usr/local/gpuhook/lib",
        "bin_dir": "/usr/bin",
        "default_capabilities": ["compute", "utility"],
        "cuda_compat": True,
    },
    "hook": {"path": None, "ldconfig": "/sbin/ldconfig"},  # path None: beside gpuhook-runtime
    "cdi": {
        "output": "/var/run/cdi/gpuhook-nvidia.json",
        "capabilities": [],
        "spec_dirs": ["/etc/cdi", "/var/run/cdi"],
    },
    "policy": {
        "kubernetes": {
            "env_requests": "verify",
            "kubelet_dir": KUBELET_DIR_DEFAULT,
            "checkpoint": "",
            "gpu_resources": list(GPU_RESOURCES_DEFAULT),
            "engine_devices": "verify",
        },
        "cdi_kinds": list(CDI_KINDS_DEFAULT),
        "standalone": {"env_requests": "trust"},
    },
    "mps": {
        "root": "/run/gpuhook/mps",
        "gpus": [],
        "groups": {},
        "replicas": None,
        "active_thread_percentage": None,
        "pinned_memory_limit": None,
        "oversubscription": "reject",
        "exclusive_process": True,
        "log_dir": False,
        "shm": "",
    },
}


def config_path(explicit: str | None = None) -> tuple[str, bool]:
    """``(path, named)``: the config file to use, and whether someone named it explicitly."""
    if explicit:
        return os.path.abspath(explicit), True
    env = os.environ.get(ENV_CONFIG, "")
    if env:
        return os.path.abspath(env), True
    return DEFAULT_PATH, False


def load(explicit: str | None = None, *, use_cache: bool = True) -> Config:
    """Load the config, from the compiled cache when it is current. Raises :class:`ConfigError`."""
    path, named = config_path(explicit)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if named:
            raise ConfigError(path, "file not found") from None
        # No config file at the default place: every key takes its default.
        return Config("(defaults)", _merge(DEFAULTS, {}), locate.resolve_runtime(""))
    except OSError as exc:
        raise ConfigError(path, exc.strerror or "cannot stat") from None
    identity = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, __version__, _KNOWN_KEYS]
    cache_dir = cache.cache_dir_for(path)
    if use_cache:
        cached = cache.read(cache_dir, identity)
        if cached is not None:
            config = Config(path, cached["config"], cached["runtime"])
            if not cache.pointer_intact(cache_dir):
                cache.write_pointer(cache_dir, config)
            return config
    data = compile_file(path)
    config = Config(path, data, locate.resolve_runtime(data["runtime"]["path"]))
    cache.write(cache_dir, identity, config)
    return config


def _key_paths(tree: Mapping[str, Any], prefix: str = "") -> str:
    """Every key of ``tree``, dotted: part of the cache's identity, so that a cache compiled by
    a build that knew other keys (under the same version string) is compiled anew."""
    paths = []
    for key, value in tree.items():
        paths.append(prefix + key)
        if isinstance(value, dict):
            paths.append(_key_paths(value, f"{prefix}{key}."))
    return " ".join(p for p in paths if p)


_KNOWN_KEYS = _key_paths(DEFAULTS)


def compile_file(path: str) -> dict[str, Any]:
    """Read, parse and validate one config file; return it normalized with defaults filled in."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise ConfigError(path, exc.strerror or "cannot read") from None
    return validate_data(path, parse_yaml(path, raw))


def parse_yaml(path: str, raw: bytes) -> Any:
    from gpuhook._site import enable_site_packages

    enable_site_packages()
    import yaml

    # The pure-Python SafeLoader, not libyaml's CSafeLoader: the C composer recurses on the C
    # stack and segfaults on deeply nested input, where Python raises RecursionError. A config
    # is parsed once per change (the compiled form is cached), so the speed does not matter.
    class _StrictLoader(yaml.SafeLoader):
        """SafeLoader that refuses duplicate and non-string keys."""

    def _construct_mapping(loader: Any, node: Any, deep: bool = False) -> dict[Any, Any]:
        seen: set[str] = set()
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=deep)
            mark = key_node.start_mark
            where = f"line {mark.line + 1}, column {mark.column + 1}"
            if not isinstance(key, str):
                raise ConfigError(path, f"{where}: a key must be a string, not {_yaml_type(key)}")
            if key in seen:
                raise ConfigError(path, f"{where}: duplicate key {key!r}")
            seen.add(key)
        return loader.construct_mapping(node, deep=deep)  # type: ignore[no-any-return]

    _StrictLoader.add_constructor(
        yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping
    )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(path, f"not UTF-8 text (byte {exc.start})") from None
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError(path, f"YAML syntax error: {where}{exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(path, f"YAML error: {exc}") from None
    except RecursionError:
        raise ConfigError(path, "YAML nested too deeply") from None
    except (ValueError, TypeError, OverflowError) as exc:  # a constructor refused a value
        raise ConfigError(path, f"invalid YAML value: {exc}") from None


def schema() -> dict[str, Any]:
    from importlib import resources

    from gpuhook import _fastjson

    text = resources.files("gpuhook").joinpath("schemas/config.schema.json").read_bytes()
    loaded = _fastjson.loads(text)
    if not isinstance(loaded, dict):
        raise ConfigError("(schema)", "the packaged config schema is not a JSON object")
    return loaded


def validate_data(path: str, data: Any) -> dict[str, Any]:
    """Validate parsed YAML against the schema; return the normalized form."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(path, f"the top level must be a mapping, not {_yaml_type(data)}")
    from gpuhook._site import enable_site_packages

    enable_site_packages()
    import jsonschema

    validator = jsonschema.Draft7Validator(schema())
    errors = sorted(validator.iter_errors(data), key=lambda e: (len(e.absolute_path), e.path))
    if errors:
        error = errors[0]
        key_path = key_path_of(error.absolute_path)
        message = error.message
        if error.validator == "additionalProperties" and isinstance(error.instance, dict):
            allowed = set(error.schema.get("properties", {}))
            extra = sorted(str(k) for k in error.instance if k not in allowed)
            if extra:
                key_path = key_path_of([*error.absolute_path, extra[0]])
                message = f"unknown key (allowed: {', '.join(sorted(allowed))})"
        elif error.validator == "type":
            message = f"must be {error.validator_value}, not {_yaml_type(error.instance)}"
        raise ConfigError(path, message, key_path or "(top level)")
    normalized = _merge(DEFAULTS, data)
    _check_semantics(path, normalized)
    return normalized


def _check_semantics(path: str, data: dict[str, Any]) -> None:
    """Rules a JSON Schema cannot state."""
    nvml = data["nvml"]["library"]
    if nvml and not nvml.startswith("/"):
        raise ConfigError(path, "must be an absolute path or empty", "nvml.library")
    inv = data["inventory"]["path"]
    if inv and not inv.startswith("/"):
        raise ConfigError(path, "must be an absolute path or empty", "inventory.path")
    log_file = data["log"]["file"]
    if log_file and not log_file.startswith("/"):
        raise ConfigError(path, "must be an absolute path or empty", "log.file")
    _check_mps(path, data["mps"])


def _check_mps(path: str, mps: dict[str, Any]) -> None:
    """GPU ids, sizes and the shm path of ``mps.*`` (the inventory-dependent checks, such as a
    shared GPU in MIG mode, happen where the inventory is read: ``gpuhook mps`` and create)."""
    from gpuhook.config import units

    if mps["shm"] and not mps["shm"].startswith("/"):
        raise ConfigError(path, "must be an absolute path or empty", "mps.shm")
    for name in mps["groups"]:
        if name.startswith("gpu") and name[3:].isdigit():
            raise ConfigError(
                path,
                "gpu<index> is the name of a per-GPU group; choose another",
                f"mps.groups.{name}",
            )
    where: dict[str, str] = {}
    lists = [("mps.gpus", mps["gpus"])]
    lists += [(f"mps.groups.{name}.gpus", g["gpus"]) for name, g in mps["groups"].items()]
    for key, ids in lists:
        for i, gpu_id in enumerate(ids):
            problem = check_gpu_id(str(gpu_id))
            if problem:
                raise ConfigError(path, problem, f"{key}[{i}]")
            if key != "mps.gpus" and str(gpu_id) in where:
                raise ConfigError(
                    path, f"GPU {gpu_id} is already in {where[str(gpu_id)]}", f"{key}[{i}]"
                )
            if key != "mps.gpus":
                where[str(gpu_id)] = key
    sizes = [("mps.pinned_memory_limit", mps["pinned_memory_limit"])]
    sizes += [
        (f"mps.groups.{name}.pinned_memory_limit", g.get("pinned_memory_limit"))
        for name, g in mps["groups"].items()
    ]
    for key, size in sizes:
        if size is not None:
            try:
                units.parse_size(size)
            except ValueError as exc:
                raise ConfigError(path, str(exc), key) from None


def key_path_of(parts: Any) -> str:
    """``['mps', 'gpus', 1, 'replicas']`` -> ``mps.gpus[1].replicas``."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _yaml_type(value: Any) -> str:
    if value is None:
        return "null"
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a mapping",
    }.get(type(value), type(value).__name__)


def _merge(defaults: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, default in defaults.items():
        value = given.get(key, default)
        if isinstance(default, dict) and isinstance(value, dict):
            out[key] = _merge(default, value)
        elif isinstance(value, list):
            out[key] = list(value)
        else:
            out[key] = value
    for key, value in given.items():  # keys with no default (open maps added by later sections)
        if key not in out:
            out[key] = value
    return out



# --- values ---------------------------------------------------------------------------------------


def check_gpu_id(gpu_id: str) -> str:
    """Why ``gpu_id`` cannot name an MPS-shared GPU in the config ("" when it can)."""
    lowered = gpu_id.strip().lower()
    if lowered.startswith("mig-") or (":" in lowered and lowered.replace(":", "").isdigit()):
        return f"{gpu_id!r} is a MIG device; MIG devices cannot be MPS-shared"
    if lowered == "all" or lowered.isdigit() or lowered.startswith("gpu-"):
        return ""
    return f"{gpu_id!r} is not a GPU index, a GPU UUID (GPU-...) or all"
