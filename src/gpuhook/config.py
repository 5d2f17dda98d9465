"""gpuhook's own configuration: YAML -> JSON Schema -> frozen :class:`Config`.

The config file is ``/etc/gpuhook/config.yaml``, or the file named by ``GPUHOOK_CONFIG`` (for
every executable), or ``--config`` on the CLI. Validation needs :mod:`yaml` and
:mod:`jsonschema`, which are far too slow to import on every container start, so a validated,
normalized copy is cached as JSON under ``/run/gpuhook/config/<absolute config path>/`` and
reused while the file's identity (device, inode, size, mtime) and gpuhook's version are unchanged.
The same folder holds ``runtime``, the pointer the ``gpuhook-runtime`` dispatcher reads to
run calls without Python: four lines, the resolved low-level runtime path, the state folder
(where the exec-env markers are), the log level and the runtime service's socket (empty: none).
Python and the dispatcher trust a cache file by the one rule of :func:`trusted_file`
(:data:`UNTRUSTED_MODE` is rendered into the dispatcher).
"""

from __future__ import annotations

import os
import sys

from gpuhook import __version__
from gpuhook.errors import ConfigError, RuntimeNotFoundError
from gpuhook.model.frozen import Frozen, _init

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

DEFAULT_PATH = "/etc/gpuhook/config.yaml"
ENV_CONFIG = "GPUHOOK_CONFIG"
ENV_DEBUG = "GPUHOOK_DEBUG"
CACHE_ROOT = "/run/gpuhook/config"
KUBELET_DIR_DEFAULT = "/var/lib/kubelet"
CHECKPOINT_IN_KUBELET_DIR = "device-plugins/kubelet_internal_checkpoint"
# The device plugin's GPU resources: whole GPUs, their shared (time-slicing, MPS) renames and MIG
# profiles. A name ending in "*" matches every name it begins. Other resources of the checkpoint
# (nvidia.com/rdma_shared_device_a, say) are never GPUs.
GPU_RESOURCES_DEFAULT = ("nvidia.com/gpu", "nvidia.com/gpu.*", "nvidia.com/mig-*")
POINTER_NAME = "runtime"
# A cache file names what root execs: one with any of these mode bits set (group- or
# world-writable) is never acted on, nor a symbolic link, nor a file owned by anyone but root or
# the running user. gpuhook.runtime.dispatch renders the dispatcher's check from this.
UNTRUSTED_MODE = 0o022
POINTER_MODE = 0o644
# The compiled gpuhook-runtime holds this byte string once, ahead of the interpreter command that
# its build writes there (gpuhook.runtime.dispatch.relocate).
DISPATCHER_MARK = b"@gpuhook-runtime interpreter@"

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
        },
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

# Where a bare runtime name is looked up besides PATH (an engine may run with a short PATH).
_SYSTEM_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
_RUNTIME_CANDIDATES = ("runc", "crun")


class PolicyConfig(Frozen):
    """``policy.*``. ``checkpoint`` is the kubelet checkpoint's path: the configured one, or
    ``<kubelet_dir>/device-plugins/kubelet_internal_checkpoint`` when the key is empty."""

    __slots__ = (
        "checkpoint",
        "gpu_resources",
        "kubelet_dir",
        "kubernetes_env_requests",
        "standalone_env_requests",
    )
    kubernetes_env_requests: str
    checkpoint: str
    standalone_env_requests: str
    kubelet_dir: str
    gpu_resources: tuple[str, ...]

    def __init__(
        self,
        kubernetes_env_requests: str,
        checkpoint: str,
        standalone_env_requests: str,
        kubelet_dir: str = KUBELET_DIR_DEFAULT,
        gpu_resources: tuple[str, ...] = GPU_RESOURCES_DEFAULT,
    ) -> None:
        _init(
            self,
            kubernetes_env_requests=kubernetes_env_requests,
            checkpoint=checkpoint or os.path.join(kubelet_dir, CHECKPOINT_IN_KUBELET_DIR),
            standalone_env_requests=standalone_env_requests,
            kubelet_dir=kubelet_dir,
            gpu_resources=tuple(gpu_resources),
        )

    def is_gpu_resource(self, name: str) -> bool:
        """Whether a device plugin resource of the checkpoint names GPUs (``gpu_resources``)."""
        return any(
            name.startswith(p[:-1]) if p.endswith("*") else name == p for p in self.gpu_resources
        )


class MpsGroupConfig(Frozen):
    """One ``mps.groups.<name>`` entry: GPUs served by one control daemon, with share overrides."""

    __slots__ = ("active_thread_percentage", "gpus", "name", "pinned_memory_limit", "replicas")
    name: str
    gpus: tuple[str, ...]
    replicas: int | None
    active_thread_percentage: int | None
    pinned_memory_limit: str | None

    def __init__(
        self,
        name: str,
        gpus: tuple[str, ...],
        replicas: int | None,
        active_thread_percentage: int | None,
        pinned_memory_limit: str | None,
    ) -> None:
        _init(
            self,
            name=name,
            gpus=tuple(gpus),
            replicas=replicas,
            active_thread_percentage=active_thread_percentage,
            pinned_memory_limit=pinned_memory_limit,
        )


class MpsConfig(Frozen):
    """``mps.*``: which GPUs are MPS-shared, their share, and how containers reach the daemons.

    GPU ids are kept as written (strings); :mod:`gpuhook.pipeline.sharing` resolves them against the
    inventory. ``enabled`` is False when no GPU is shared (the create path then never imports
    the sharing code).
    """

    __slots__ = (
        "active_thread_percentage",
        "exclusive_process",
        "gpus",
        "groups",
        "log_dir",
        "oversubscription",
        "pinned_memory_limit",
        "replicas",
        "root",
        "shm",
    )
    root: str
    gpus: tuple[str, ...]
    groups: tuple[MpsGroupConfig, ...]
    replicas: int | None
    active_thread_percentage: int | None
    pinned_memory_limit: str | None
    oversubscription: str
    exclusive_process: bool
    log_dir: bool
    shm: str

    def __init__(self, data: Mapping[str, Any]) -> None:
        groups = data.get("groups") or {}
        _init(
            self,
            root=data["root"],
            gpus=tuple(str(g) for g in data["gpus"]),
            groups=tuple(
                MpsGroupConfig(
                    name,
                    tuple(str(g) for g in group["gpus"]),
                    group.get("replicas"),
                    group.get("active_thread_percentage"),
                    group.get("pinned_memory_limit"),
                )
                for name, group in groups.items()
            ),
            replicas=data["replicas"],
            active_thread_percentage=data["active_thread_percentage"],
            pinned_memory_limit=data["pinned_memory_limit"],
            oversubscription=data["oversubscription"],
            exclusive_process=data["exclusive_process"],
            log_dir=data["log_dir"],
            shm=data["shm"],
        )

    @property
    def enabled(self) -> bool:
        return bool(self.gpus or self.groups)


class Config(Frozen):
    """The validated configuration. ``data`` is the normalized nested form (defaults filled in)."""

    __slots__ = (
        "auto_refresh",
        "bin_dir",
        "cdi_capabilities",
        "cdi_output",
        "data",
        "default_capabilities",
        "dev_root",
        "driver_root",
        "inventory_path",
        "ldconfig",
        "lib_dir",
        "log_file",
        "log_level",
        "mps",
        "nvml_library",
        "policy",
        "runtime",
        "service_socket",
        "source",
        "state_dir",
    )
    source: str
    data: dict[str, Any]
    driver_root: str
    dev_root: str
    state_dir: str
    runtime: str  # resolved absolute path, "" when not found
    service_socket: str  # the runtime service's socket, "" for none
    log_level: str
    log_file: str
    nvml_library: str
    inventory_path: str
    auto_refresh: bool
    lib_dir: str
    bin_dir: str
    default_capabilities: tuple[str, ...]
    ldconfig: str
    cdi_output: str  # "" when the inventory refresh writes no CDI spec
    cdi_capabilities: tuple[str, ...]
    policy: PolicyConfig
    mps: MpsConfig

    def __init__(self, source: str, data: dict[str, Any], runtime: str) -> None:
        inv = data["inventory"]
        pol = data["policy"]
        _init(
            self,
            source=source,
            data=data,
            driver_root=data["driver_root"],
            dev_root=data["dev_root"],
            state_dir=data["state_dir"],
            runtime=runtime,
            service_socket=data["runtime"]["service"],
            log_level="debug"
            if os.environ.get(ENV_DEBUG, "") not in ("", "0")
            else data["log"]["level"],
            log_file=data["log"]["file"],
            nvml_library=data["nvml"]["library"],
            inventory_path=inv["path"] or os.path.join(data["state_dir"], "inventory.json"),
            auto_refresh=inv["auto_refresh"],
            lib_dir=data["inject"]["lib_dir"],
            bin_dir=data["inject"]["bin_dir"],
            default_capabilities=tuple(data["inject"]["default_capabilities"]),
            ldconfig=data["hook"]["ldconfig"],
            cdi_output=data["cdi"]["output"],
            cdi_capabilities=tuple(data["cdi"]["capabilities"])
            or tuple(data["inject"]["default_capabilities"]),
            policy=PolicyConfig(
                pol["kubernetes"]["env_requests"],
                pol["kubernetes"]["checkpoint"],
                pol["standalone"]["env_requests"],
                pol["kubernetes"]["kubelet_dir"],
                tuple(pol["kubernetes"]["gpu_resources"]),
            ),
            mps=MpsConfig(data["mps"]),
        )

    @property
    def cuda_compat(self) -> bool:
        """``inject.cuda_compat``: use an image's CUDA forward compatibility libraries when they
        are newer than the host driver and support its branch and GPUs."""
        return bool(self.data["inject"]["cuda_compat"])

    @property
    def hook_path(self) -> str:
        """The hook's program (resolved when a hook is added, not at every load)."""
        return self.data["hook"]["path"] or default_hook_path()[0]

    @property
    def hook_path_source(self) -> str:
        """Why :attr:`hook_path` is what it is, for doctor."""
        if self.data["hook"]["path"]:
            return f"hook.path in {self.source}"
        return default_hook_path()[1]

    @property
    def cdi_spec_dirs(self) -> tuple[str, ...]:
        """The CDI spec folders the node's engines read, lowest priority first (cold code)."""
        return tuple(self.data["cdi"]["spec_dirs"])

    @property
    def records_dir(self) -> str:
        return os.path.join(self.state_dir, "containers")

    @property
    def propagated_env(self) -> tuple[str, ...]:
        """gpuhook's own variables for the hooks it adds to a container, whose env is otherwise
        PATH alone: the config file when it is not the default one, and ``GPUHOOK_DEBUG=1`` when
        the environment (not the file) turned debug on. Never anything from the container."""
        out: list[str] = []
        if self.source.startswith("/") and self.source != DEFAULT_PATH:
            out.append(f"{ENV_CONFIG}={self.source}")
        if self.log_level == "debug" and self.data["log"]["level"] != "debug":
            out.append(f"{ENV_DEBUG}=1")
        return tuple(out)

    def require_runtime(self) -> str:
        if not self.runtime:
            wanted = self.data["runtime"]["path"] or " or ".join(_RUNTIME_CANDIDATES)
            raise RuntimeNotFoundError(
                f"low-level OCI runtime {wanted} not found (searched PATH and "
                f"{':'.join(_SYSTEM_PATH)}); install runc or set runtime.path in {self.source}"
            )
        return self.runtime


# --- locating the file --------------------------------------------------------------------------


def config_path(explicit: str | None = None) -> tuple[str, bool]:
    """``(path, named)``: the config file to use, and whether someone named it explicitly."""
    if explicit:
        return os.path.abspath(explicit), True
    env = os.environ.get(ENV_CONFIG, "")
    if env:
        return os.path.abspath(env), True
    return DEFAULT_PATH, False


def cache_dir_for(path: str) -> str:
    """The cache folder of one config file: its absolute path mirrored under CACHE_ROOT.

    A mirrored path (not a hash) lets the dispatcher compute it without any lookup.
    """
    return CACHE_ROOT + os.path.abspath(path)


# --- hook.path unset: the gpuhook beside the running program ----------------------------------

ENV_SELF = "GPUHOOK_SELF"  # the dispatchers' own path, set for the Python they exec
SHIM_ENTRY = "_shim_entry.py"  # the scripts the dispatchers run, in the gpuhook package folder
CLI_ENTRY = "_cli_entry.py"
ENTRY_SCRIPTS = (SHIM_ENTRY, CLI_ENTRY)
PROGRAMS = ("gpuhook-runtime", "gpuhook")
FALLBACK_HOOK_PATH = "/usr/bin/gpuhook"


def running_program(argv0: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """The gpuhook-runtime or gpuhook executable this process runs as, its links resolved; ""
    when it runs as neither (``python -m gpuhook``, a test). The .deb's and ``make build``'s
    dispatchers name themselves in ``GPUHOOK_SELF`` and run an entry script; a pip install's
    console script is ``argv[0]`` itself. Host paths only: the engine's argv and env."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    env = os.environ if environ is None else environ
    if os.path.basename(argv0) in ENTRY_SCRIPTS:
        argv0 = env.get(ENV_SELF, "")
    if os.path.basename(argv0) not in PROGRAMS or not argv0:
        return ""
    return os.path.realpath(argv0)


def default_hook_path() -> tuple[str, str]:
    """hook.path when the config does not set it, and why: the ``gpuhook`` installed in the
    folder of the running gpuhook-runtime (or gpuhook), else /usr/bin/gpuhook."""
    program = running_program()
    if not program:
        return FALLBACK_HOOK_PATH, "hook.path unset and not run as gpuhook(-runtime): the default"
    return os.path.join(os.path.dirname(program), "gpuhook"), f"hook.path unset: beside {program}"


# --- loading --------------------------------------------------------------------------------------


def load(explicit: str | None = None, *, use_cache: bool = True) -> Config:
    """Load the config, from the compiled cache when it is current. Raises :class:`ConfigError`."""
    path, named = config_path(explicit)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if named:
            raise ConfigError(path, "file not found") from None
        # No config file at the default place: every key takes its default.
        return Config("(defaults)", _merge(DEFAULTS, {}), resolve_runtime(""))
    except OSError as exc:
        raise ConfigError(path, exc.strerror or "cannot stat") from None
    identity = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, __version__, _key_paths(DEFAULTS)]
    cache_dir = cache_dir_for(path)
    if use_cache:
        cached = _read_cache(cache_dir, identity)
        if cached is not None:
            config = Config(path, cached["config"], cached["runtime"])
            if not _pointer_intact(cache_dir):
                _write_pointer(cache_dir, config)
            return config
    data = compile_file(path)
    config = Config(path, data, resolve_runtime(data["runtime"]["path"]))
    _write_cache(cache_dir, identity, config)
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


def _read_cache(cache_dir: str, identity: list[Any]) -> dict[str, Any] | None:
    from gpuhook import _fastjson

    path = os.path.join(cache_dir, "compiled.json")
    try:
        with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb") as fh:
            if not trusted_file(os.fstat(fh.fileno())):
                return None
            cached = _fastjson.loads(fh.read())
    except (OSError, ValueError):
        return None
    if not isinstance(cached, dict) or cached.get("identity") != identity:
        return None
    if not isinstance(cached.get("config"), dict) or not isinstance(cached.get("runtime"), str):
        return None
    return cached


def trusted_file(st: os.stat_result) -> bool:
    """A cache file this process may act on (``st`` of the file opened without following a
    link): a regular file written by root or by this user, and writable by no one else. The
    cache names the runtime that gpuhook-runtime execs, as root."""
    import stat

    return (
        stat.S_ISREG(st.st_mode)
        and st.st_uid in (0, os.geteuid())
        and not st.st_mode & UNTRUSTED_MODE
    )


def pointer_text(config: Config) -> str:
    """The dispatcher's pointer: runtime, state folder, log level, service socket (one line
    each; the socket's may be empty)."""
    # The file's level, never GPUHOOK_DEBUG of the process that happens to write the pointer:
    # the dispatcher reads that variable of each call itself.
    lines = (config.runtime, config.state_dir, config.data["log"]["level"])
    if any("\n" in x or not x for x in lines) or not all(x.startswith("/") for x in lines[:2]):
        return ""
    socket = config.service_socket
    if "\n" in socket or (socket and not socket.startswith("/")):
        socket = ""
    return "".join(x + "\n" for x in (*lines, socket))


def _pointer_intact(cache_dir: str) -> bool:
    """The pointer is there and trusted (else it is written anew)."""
    try:
        st = os.lstat(os.path.join(cache_dir, POINTER_NAME))
    except FileNotFoundError:
        return False  # _write_pointer writes it only when the config allows one
    except OSError:
        return True  # unreadable here: nothing this process could repair
    return trusted_file(st)


def _write_cache(cache_dir: str, identity: list[Any], config: Config) -> None:
    """Best effort: a node where /run/gpuhook is not writable only loses speed."""
    from gpuhook import _fastjson
    from gpuhook.fsutil import atomic_write

    try:
        os.makedirs(cache_dir, mode=0o755, exist_ok=True)
        body = {"identity": identity, "config": config.data, "runtime": config.runtime}
        atomic_write(
            os.path.join(cache_dir, "compiled.json"),
            _fastjson.dumps(body).encode(),
            0o644,
            fsync=False,
        )
    except OSError:
        return
    _write_pointer(cache_dir, config)


def _write_pointer(cache_dir: str, config: Config) -> None:
    """(Re)write the dispatcher's pointer, or remove it when the config allows none."""
    from gpuhook.fsutil import atomic_write

    runtime_file = os.path.join(cache_dir, POINTER_NAME)
    pointer = pointer_text(config)
    try:
        if pointer:
            atomic_write(runtime_file, pointer.encode(), POINTER_MODE, fsync=False)
        elif os.path.lexists(runtime_file):
            os.unlink(runtime_file)
    except OSError:
        pass


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
                parse_size(size)
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


# --- the low-level runtime ---------------------------------------------------------------------


def resolve_runtime(configured: str) -> str:
    """Absolute path of the low-level runtime, or "" when it cannot be found."""
    names = (configured,) if configured else _RUNTIME_CANDIDATES
    for name in names:
        found = which(name)
        if found and not _is_gpuhook_runtime(found):
            return found
    return ""


def which(name: str) -> str:
    if "/" in name:
        return name if os.access(name, os.X_OK) and os.path.isfile(name) else ""
    dirs = [d for d in os.environ.get("PATH", "").split(":") if d]
    dirs += [d for d in _SYSTEM_PATH if d not in dirs]
    for folder in dirs:
        candidate = os.path.join(folder, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return ""


def _is_gpuhook_runtime(path: str) -> bool:
    """Refuse a runtime.path that points back at gpuhook-runtime (an exec loop): the compiled
    dispatcher (it holds :data:`DISPATCHER_MARK`) or a script that names it."""
    import mmap

    try:
        with open(path, "rb") as fh:
            if fh.read(2) == b"#!":
                return b"gpuhook-runtime" in fh.read(510)
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return data.find(DISPATCHER_MARK) >= 0
    except (OSError, ValueError):
        return False


# --- sizes and GPU ids in mps.* (the MPS plan reads them through these too) ---

MIB = 1 << 20
GIB = 1 << 30
_UNITS = {"k": 1 << 10, "m": MIB, "g": GIB, "t": 1 << 40}


# --- values ---------------------------------------------------------------------------------------


def check_gpu_id(gpu_id: str) -> str:
    """Why ``gpu_id`` cannot name an MPS-shared GPU in the config ("" when it can)."""
    lowered = gpu_id.strip().lower()
    if lowered.startswith("mig-") or (":" in lowered and lowered.replace(":", "").isdigit()):
        return f"{gpu_id!r} is a MIG device; MIG devices cannot be MPS-shared"
    if lowered == "all" or lowered.isdigit() or lowered.startswith("gpu-"):
        return ""
    return f"{gpu_id!r} is not a GPU index, a GPU UUID (GPU-...) or all"


def parse_size(text: object) -> int:
    """``512M``, ``20G``, ``1.5GiB`` -> bytes (binary units, as MPS reads them). Raises
    ValueError with a one-line reason."""
    if not isinstance(text, str):
        raise ValueError(f"{text!r} is not a size (e.g. 512M or 20G)")
    raw = text.strip()
    lowered = raw.lower()
    for suffix in ("ib", "b"):
        if lowered.endswith(suffix) and len(lowered) > len(suffix) + 1:
            lowered = lowered[: -len(suffix)]
            break
    unit = _UNITS.get(lowered[-1:]) if lowered else None
    number = lowered[:-1]
    if unit is None or not number or number.count(".") > 1 or not number.replace(".", "").isdigit():
        raise ValueError(f"{text!r} is not a size (a number and a unit K, M, G or T: 512M, 20G)")
    value = int(float(number) * unit) if "." in number else int(number) * unit
    if value < MIB:
        raise ValueError(f"{text!r} is less than 1M")
    return value
