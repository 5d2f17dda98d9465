"""``gpuhook doctor``: check the node, one small function per check.

A check is a function ``(Node) -> Result | list[Result]`` registered with :func:`register`; it
reads what it needs from the :class:`Node` (the config, the inventory, the engine configs) and
says ``pass``, ``warn``, ``fail`` or ``skip`` with one line, and for a failure (or a warning) the
fix. A new check is one registered function; :func:`run` runs them in order and never lets one
check's crash hide the others. The CLI renders the results (``tables.doctor_table``) and exits
non-zero when any check fails.
"""

from __future__ import annotations

import os
import time

from gpuhook.config import loading as config_loading
from gpuhook.engines import readers
from gpuhook.errors import ConfigError
from gpuhook.runtime import locate

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from gpuhook.config.types import Config
    from gpuhook.inventory.store import Status
    from gpuhook.model.inventory import Inventory

    CheckFunction = Callable[["Node"], "Result | list[Result]"]

PASS = "pass"  # noqa: S105 - a status word
WARN = "warn"
FAIL = "fail"
SKIP = "skip"
STATUSES = (PASS, WARN, FAIL, SKIP)


class Result:
    """One line of the report. ``fix`` says what to do about a failure or warning."""

    def __init__(self, check: str, status: str, message: str, fix: str = "") -> None:
        if status not in STATUSES:
            raise ValueError(f"unknown check status {status!r}")
        self.check = check
        self.status = status
        self.message = " ".join(message.split())
        self.fix = " ".join(fix.split())

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "status": self.status,
            "message": self.message,
            "fix": self.fix,
        }

    def __repr__(self) -> str:
        return f"Result({self.check!r}, {self.status!r}, {self.message!r}, {self.fix!r})"


class Node:
    """What the checks look at: the config (loaded and validated afresh, not from the cache),
    the inventory and the engines' configs, each read once."""

    def __init__(
        self,
        config_file: str | None = None,
        *,
        docker_config: str = readers.DEFAULT_PATHS[readers.DOCKER],
        containerd_config: str = readers.DEFAULT_PATHS[readers.CONTAINERD],
        podman_config: str = readers.DEFAULT_PATHS[readers.PODMAN],
        now: float | None = None,
    ) -> None:
        self.config_file = config_file
        self.engine_paths = {
            readers.DOCKER: docker_config,
            readers.CONTAINERD: containerd_config,
            readers.PODMAN: podman_config,
        }
        self.now = time.time() if now is None else now
        self.config: Config | None = None
        self.config_error: ConfigError | None = None
        try:
            self.config = config_loading.load(config_file, use_cache=False)
        except ConfigError as exc:
            self.config_error = exc
        self._status: Status | None = None
        self._engines: dict[str, readers.Registration] = {}

    def need_config(self) -> Config:
        if self.config is None:
            raise RuntimeError("check registered with needs_config=False used the config")
        return self.config

    def inventory_status(self) -> Status:
        if self._status is None:
            from gpuhook.inventory import store

            self._status = store.status(self.need_config())
        return self._status

    def inventory(self) -> Inventory | None:
        return self.inventory_status().inventory

    def engine(self, engine: str) -> readers.Registration:
        if engine not in self._engines:
            self._engines[engine] = readers.read(engine, self.engine_paths[engine])
        return self._engines[engine]


class Check:
    def __init__(self, name: str, function: CheckFunction, needs_config: bool) -> None:
        self.name = name
        self.function = function
        self.needs_config = needs_config


CHECKS: list[Check] = []


def register(
    name: str, *, needs_config: bool = True, before: str | None = None
) -> Callable[[CheckFunction], CheckFunction]:
    """Decorator: add a check (or replace the one of that name, in place). ``before`` puts a
    new check ahead of the named one; otherwise it goes last. ``needs_config``: skipped, with a
    pointer to the config check, when the config is invalid."""

    def decorate(function: CheckFunction) -> CheckFunction:
        check = Check(name, function, needs_config)
        for i, existing in enumerate(CHECKS):
            if existing.name == name:
                CHECKS[i] = check
                return function
        index = next((i for i, c in enumerate(CHECKS) if c.name == before), len(CHECKS))
        CHECKS.insert(index, check)
        return function

    return decorate


def run(node: Node, checks: list[Check] | None = None) -> list[Result]:
    results: list[Result] = []
    for check in CHECKS if checks is None else checks:
        if check.needs_config and node.config is None:
            results.append(Result(check.name, SKIP, "needs a valid config (see the config check)"))
            continue
        try:
            out = check.function(node)
        except Exception as exc:  # one broken check must not hide the others
            from gpuhook.errors import describe

            results.append(Result(check.name, FAIL, f"the check itself failed: {describe(exc)[1]}"))
            continue
        results.extend(out if isinstance(out, list) else [out])
    return results


def view(results: list[Result]) -> dict[str, Any]:
    summary = {s: sum(1 for r in results if r.status == s) for s in STATUSES}
    return {
        "ok": summary[FAIL] == 0,
        "summary": summary,
        "checks": [r.to_dict() for r in results],
    }


# --- the checks, in the order they are reported ---------------------------------------------------


@register("config", needs_config=False)
def check_config(node: Node) -> Result:
    if node.config_error is not None:
        path = node.config_error.path
        return Result(
            "config",
            FAIL,
            str(node.config_error),
            f"edit {path} (check it with: gpuhook config validate {path})",
        )
    config = node.need_config()
    if not config.source.startswith("/"):
        path, _ = config_loading.config_path(node.config_file)
        return Result("config", PASS, f"no config file at {path}: every key takes its default")
    return Result("config", PASS, f"{config.source} is valid")


@register("inventory")
def check_inventory(node: Node) -> Result:
    config = node.need_config()
    status = node.inventory_status()
    fix = "gpuhook inventory refresh"
    path = config.inventory_path
    inv = status.inventory
    if inv is None:
        if not os.path.lexists(path):
            return Result("inventory", FAIL, f"no inventory at {path}", fix)
        return Result("inventory", FAIL, status.reason.split("; run:")[0], fix)
    if not status.fresh:
        if config.auto_refresh:
            return Result(
                "inventory",
                WARN,
                f"{path} is stale ({status.reason}); the next GPU container's create will "
                "refresh it (and wait for NVML)",
                fix,
            )
        return Result(
            "inventory",
            FAIL,
            f"{path} is stale ({status.reason}) and inventory.auto_refresh is off: GPU "
            "containers get what it says",
            fix,
        )
    from gpuhook.cli.render import age

    built = age(node.now - inv.generated_at)
    if not inv.gpus:
        return Result(
            "inventory",
            WARN,
            f"{path}: NVML reports no GPU (driver {inv.driver_version or 'unknown'}, "
            f"built {built})",
            "check the driver (nvidia-smi), then: gpuhook inventory refresh",
        )
    migs = sum(len(g.mig_devices) for g in inv.gpus)
    return Result(
        "inventory",
        PASS,
        f"{path}: {len(inv.gpus)} GPUs, {migs} MIG devices, driver {inv.driver_version}, "
        f"built {built}",
    )


NODE_FIX = (
    "load the NVIDIA kernel modules and create the device nodes (nvidia-modprobe -c 0 -u, or "
    "run nvidia-smi once), then: gpuhook inventory refresh"
)
# Control nodes CUDA cannot work without; the others only some workloads use.
REQUIRED_CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm")


@register("device nodes")
def check_device_nodes(node: Node) -> Result:
    from gpuhook.inventory import driverroot

    config = node.need_config()
    inv = node.inventory()
    if inv is None:
        return Result("device nodes", SKIP, "needs the inventory (see the inventory check)")
    found: dict[str, list[str]] = {k: [] for k in NODE_STATES}
    for state, text in _gpu_node_states(config.dev_root, inv) + _control_node_states(
        config.dev_root, inv
    ):
        found[state].append(text)
    return _device_nodes_result(found, driverroot.host_path(config.dev_root, "/dev"))


NODE_STATES = ("present", "missing", "changed", "unlisted", "optional")


def _node_state(
    dev_root: str, path: str, what: str, major: int | None, minor: int | None
) -> tuple[str, str]:
    """One expected node: ("present" | "missing" | "changed", what to say)."""
    from gpuhook.inventory import driverroot

    found = driverroot.read_node(dev_root, path)
    host = driverroot.host_path(dev_root, path)
    if found is None:
        return "missing", f"{host} ({what})"
    if major is not None and (found.major, found.minor) != (major, minor):
        return (
            "changed",
            f"{host} is {found.major}:{found.minor}, the inventory says {major}:{minor}",
        )
    return "present", host


def _gpu_node_states(dev_root: str, inv: Inventory) -> list[tuple[str, str]]:
    """The node of every GPU of the inventory, and the caps of its MIG devices."""
    from gpuhook.inventory import driverroot

    out = []
    for gpu in inv.gpus:
        if gpu.node is None:
            host = driverroot.host_path(dev_root, f"/dev/nvidia{gpu.minor}")
            out.append(("missing", f"{host} (GPU {gpu.index})"))
        else:
            node = gpu.node
            out.append(_node_state(dev_root, node.path, f"GPU {gpu.index}", node.major, node.minor))
        out += [
            _node_state(dev_root, cap.path, f"MIG {mig.display_id}", cap.major, cap.minor)
            for mig in gpu.mig_devices
            for cap in mig.caps
        ]
    return out


def _control_node_states(dev_root: str, inv: Inventory) -> list[tuple[str, str]]:
    """Every control node gpuhook knows: as the inventory lists it, present but not listed,
    missing (a required one) or absent (an optional one)."""
    from gpuhook.inventory import catalog, driverroot

    known = {n.path: n for n in inv.control_nodes}
    out = []
    for path in catalog.CONTROL_NODES:
        host = driverroot.host_path(dev_root, path)
        if path in known:
            out.append(_node_state(dev_root, path, "control", known[path].major, known[path].minor))
        elif driverroot.read_node(dev_root, path) is not None:
            out.append(("unlisted", host))
        elif path in REQUIRED_CONTROL_NODES:
            out.append(("missing", f"{host} (control)"))
        else:
            out.append(("optional", host))
    return out


def _device_nodes_result(found: dict[str, list[str]], where: str) -> Result:
    count = len(found["present"]) + len(found["unlisted"])
    if found["missing"]:
        return Result("device nodes", FAIL, "missing: " + ", ".join(found["missing"]), NODE_FIX)
    if found["changed"]:
        return Result(
            "device nodes",
            FAIL,
            "changed: " + "; ".join(found["changed"]),
            "gpuhook inventory refresh",
        )
    if found["unlisted"]:
        return Result(
            "device nodes",
            WARN,
            f"{count} present under {where}; not in the inventory (containers do not get "
            f"them): {', '.join(found['unlisted'])}",
            "gpuhook inventory refresh",
        )
    if found["optional"]:
        return Result(
            "device nodes",
            WARN,
            f"{count} present under {where}; not present: {', '.join(found['optional'])} (only "
            "some workloads need them)",
            NODE_FIX,
        )
    return Result("device nodes", PASS, f"{count} present under {where} (GPUs, MIG, control)")


@register("dev char links")
def check_dev_char_links(node: Node) -> Result:
    """/dev/char/<major>:<minor> for every NVIDIA node (systemd cgroup driver, daemon-reload)."""
    from gpuhook.inventory import devchar

    name = "dev char links"
    inv = node.inventory()
    if inv is None:
        return Result(name, SKIP, "needs the inventory (see the inventory check)")
    found = devchar.check(node.need_config().dev_root, inv)
    bad = found["missing"] + found["wrong"] + found["blocked"]
    if bad:
        return Result(
            name,
            WARN,
            f"{len(bad)} of {len(bad) + len(found['ok'])} NVIDIA device nodes lack a correct "
            f"/dev/char link: {', '.join(bad)}; with the systemd cgroup driver their containers "
            "lose the GPU at the next systemctl daemon-reload",
            "gpuhook inventory refresh (it makes the links)",
        )
    return Result(name, PASS, f"{len(found['ok'])} NVIDIA device nodes linked under /dev/char")


@register("libraries")
def check_libraries(node: Node) -> list[Result]:
    from gpuhook.inventory import catalog

    config = node.need_config()
    inv = node.inventory()
    if inv is None:
        return [Result("libraries", SKIP, "needs the inventory (see the inventory check)")]
    missing_by_cap = dict(inv.missing_libraries)
    results = []
    for cap, names in catalog.LIBRARIES.items():
        if not names:
            continue  # compat32: the 32-bit copies of other capabilities' libraries
        name = f"libraries {cap}"
        found = [lib for lib in inv.libraries if lib.capability == cap]
        missing = list(missing_by_cap.get(cap, ()))
        required = [n for n in missing if n in catalog.REQUIRED_LIBRARIES]
        gone = [lib.path for lib in found if not os.path.isfile(lib.path)]
        if required:
            results.append(
                Result(
                    name,
                    FAIL,
                    f"required {', '.join(required)} not found under {config.driver_root}",
                    f"install the NVIDIA driver's user-space libraries under driver_root "
                    f"({config.driver_root}), then: gpuhook inventory refresh",
                )
            )
        elif gone:
            results.append(
                Result(
                    name,
                    FAIL,
                    f"listed by the inventory but gone: {', '.join(gone)}",
                    "gpuhook inventory refresh",
                )
            )
        elif not found:
            results.append(
                Result(
                    name,
                    WARN,
                    f"none found under {config.driver_root}: containers asking for {cap} get no "
                    f"{cap} libraries",
                    f"install the driver's {cap} libraries if containers need them, then: "
                    "gpuhook inventory refresh",
                )
            )
        elif missing:
            results.append(
                Result(
                    name,
                    WARN,
                    f"{len(found)} found; not found: {', '.join(missing)} (optional: not every "
                    "driver or system ships them)",
                )
            )
        else:
            results.append(Result(name, PASS, f"{len(found)} found"))
    return results


@register("runtime")
def check_runtime(node: Node) -> Result:
    import subprocess

    config = node.need_config()
    fix = f"install runc (apt-get install runc) or set runtime.path in {config.source}"
    if not config.runtime:
        wanted = config.data["runtime"]["path"] or "runc or crun"
        return Result(
            "runtime",
            FAIL,
            f"low-level OCI runtime {wanted} not found: gpuhook-runtime cannot start any container",
            fix,
        )
    try:
        proc = subprocess.run(
            [config.runtime, "--version"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Result("runtime", FAIL, f"{config.runtime} --version: {exc}", fix)
    first = (proc.stdout.strip().splitlines() or [""])[0]
    if proc.returncode != 0:
        return Result(
            "runtime", FAIL, f"{config.runtime} --version exited with {proc.returncode}", fix
        )
    return Result("runtime", PASS, f"{config.runtime} ({first or 'version unknown'})")


@register("runtime service")
def check_runtime_service(node: Node) -> Result:
    from gpuhook.runtime import service

    config = node.need_config()
    name = "runtime service"
    path = config.service_socket
    if not path:
        return Result(
            name,
            SKIP,
            f"disabled in config (runtime.service is empty in {config.source}): creates with a "
            "GPU marker start Python",
        )
    problem = service.probe(path)
    if problem:
        return Result(
            name,
            WARN,
            f"not running ({problem}): creates with a GPU marker start Python: slower, still "
            "correct",
            "systemctl enable --now gpuhook-runtime.service (or run: gpuhook runtime serve)",
        )
    return Result(name, PASS, f"listening at {path}")


@register("hook")
def check_hook(node: Node) -> Result:
    config = node.need_config()
    for key, path in (("hook.path", config.hook_path), ("hook.ldconfig", config.ldconfig)):
        if not locate.which(path):  # both absolute paths
            return Result(
                "hook",
                FAIL,
                f"{key} {path} is not an executable: GPU containers fail to start"
                + (f" ({config.hook_path_source})" if key == "hook.path" else ""),
                f"install it there or set {key} in {config.source}",
            )
    return Result(
        "hook",
        PASS,
        f"{config.hook_path} hook update-ldcache ({config.hook_path_source}), "
        f"with {config.ldconfig}",
    )


def _engine_result(node: Node, engine: str) -> Result:
    reg = node.engine(engine)
    configure = f"gpuhook runtime configure --runtime {engine} --set-as-default"
    if readers.SERVICE[engine]:  # none for podman: it reads containers.conf on every command
        configure += f", then: systemctl restart {readers.SERVICE[engine]}"
    daemon = readers.DAEMON[engine]
    if not reg.exists:
        if locate.which(daemon):
            return Result(
                engine,
                WARN,
                f"{daemon} is installed but {reg.path} does not exist: {engine} runs its "
                f"containers with {'its default runtime' if engine == readers.PODMAN else 'runc'}, "
                "not gpuhook",
                configure,
            )
        return Result(engine, SKIP, f"not installed ({reg.path} not found)")
    if reg.error:
        return Result(
            engine, FAIL, f"{reg.path}: {reg.error}", f"repair {reg.path}, then: {configure}"
        )
    ours = reg.gpuhook_runtimes
    if not ours:
        names = ", ".join(sorted(reg.runtimes)) or "none"
        return Result(
            engine,
            FAIL,
            f"{reg.path} does not register gpuhook-runtime (runtimes: {names}; default "
            f"{reg.default}): its containers bypass gpuhook",
            configure,
        )
    for name, path in ours.items():
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            return Result(
                engine,
                FAIL,
                f"{reg.path} registers runtime {name} -> {path}, which is not an executable",
                f"install gpuhook, or: {configure} --runtime-path <the gpuhook-runtime path>",
            )
    if not reg.default_is_gpuhook:
        name, path = next(iter(ours.items()))
        return Result(
            engine,
            WARN,
            f"runtime {name} -> {path} is registered in {reg.path}, but the default runtime is "
            f"{reg.default}: only containers that name runtime {name} go through gpuhook",
            configure,
        )
    return Result(
        engine,
        PASS,
        f"runtime {reg.default} -> {ours[reg.default]} is the default in {reg.path}",
    )


@register(readers.DOCKER, needs_config=False)
def check_docker(node: Node) -> Result:
    return _engine_result(node, readers.DOCKER)


@register(readers.CONTAINERD, needs_config=False)
def check_containerd(node: Node) -> Result:
    return _engine_result(node, readers.CONTAINERD)


@register(readers.PODMAN, needs_config=False)
def check_podman(node: Node) -> Result:
    return _engine_result(node, readers.PODMAN)


@register("engines", needs_config=False)
def check_engines(node: Node) -> list[Result]:
    """Only speaks when nothing registers gpuhook and no engine check failed already."""
    regs = [node.engine(e) for e in readers.ENGINES]
    if any(r.gpuhook_runtimes for r in regs):
        return []
    if any(r.exists and (r.error or not r.gpuhook_runtimes) for r in regs):
        return []  # that engine's own check failed with its fix
    *others, last = readers.ENGINES
    return [
        Result(
            "engines",
            FAIL,
            f"gpuhook-runtime is registered with neither {', '.join(others)} nor {last}: no "
            "container goes through gpuhook",
            f"gpuhook runtime configure --runtime {'|'.join(readers.ENGINES)} --set-as-default",
        )
    ]


@register("cdi")
def check_cdi(node: Node) -> Result:
    """The CDI spec at ``cdi.output``: there, valid, and naming the inventory's devices."""
    config = node.need_config()
    path = config.cdi_output
    if not path:
        return Result("cdi", SKIP, "cdi.output is empty: gpuhook keeps no CDI spec")
    inventory = node.inventory()
    if inventory is None:
        return Result("cdi", SKIP, "no inventory: the CDI spec cannot be compared with it")
    from gpuhook.engines import cdi

    found = cdi.conflicts(cdi.spec(inventory, config), path, config.cdi_spec_dirs)
    if found:
        more = f" (and {len(found) - 1} more spec)" if len(found) > 1 else ""
        return Result("cdi", FAIL, f"{found[0].line()}{more}", cdi.CONFLICT_FIX)
    fix = "gpuhook inventory refresh"
    problem = _cdi_problem(path, inventory, config)
    if problem:
        return Result("cdi", WARN, f"{path}: {problem}", fix)
    return Result("cdi", PASS, f"{path}: a valid CDI spec of the inventory's devices")


def _cdi_problem(path: str, inventory: Inventory, config: Config) -> str:
    """Why the spec at ``path`` is not the inventory's (missing, invalid, stale); "" if it is."""
    from gpuhook.engines import cdi
    from gpuhook.errors import CdiError

    try:
        written = cdi.load(path)
        cdi.validate(written)
    except FileNotFoundError:
        return (
            "does not exist: engines that resolve CDI devices themselves (podman, CRI-O, "
            "containerd with enable_cdi) cannot inject nvidia.com/gpu devices"
        )
    except (OSError, ValueError, CdiError) as exc:
        return f"unreadable or invalid ({exc})"
    if written != cdi.spec(inventory, config):
        return "differs from what the inventory and config make (stale: gpuhook inventory refresh)"
    return ""


@register("engine cdi", needs_config=True)
def check_engine_cdi(node: Node) -> list[Result]:
    """Engines that resolve CDI themselves must find gpuhook's spec in their spec folders."""
    config = node.need_config()
    results = []
    for engine in readers.ENGINES:  # those that resolve CDI themselves: reg.cdi
        reg = node.engine(engine)
        if reg.error or not reg.cdi or not (reg.exists or locate.which(readers.DAEMON[engine])):
            continue
        folders = ", ".join(reg.cdi_dirs) or "(none)"
        output = config.cdi_output
        if output and os.path.isfile(output) and _in_folders(output, reg.cdi_dirs):
            results.append(
                Result("engine cdi", PASS, f"{engine} reads gpuhook's CDI spec {output}")
            )
            continue
        results.append(
            Result(
                "engine cdi",
                WARN,
                f"{engine} resolves CDI devices from {folders}, but gpuhook's spec is not there "
                f"(cdi.output: {output or 'empty'}): its containers that ask for nvidia.com/gpu "
                "CDI devices fail to start",
                f"set cdi.output to a file in {reg.cdi_dirs[0] if reg.cdi_dirs else '/etc/cdi'} "
                f"in {config.source}, then: gpuhook inventory refresh",
            )
        )
    return results


def _in_folders(path: str, folders: tuple[str, ...]) -> bool:
    parent = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    return any(os.path.realpath(f) == parent for f in folders)


@register("mps")
def check_mps(node: Node) -> list[Result]:
    """The control daemon of every MPS share group (a container granted a GPU of a group whose
    daemon is down fails to start), and the compute mode of its GPUs."""
    from gpuhook.errors import GpuhookError
    from gpuhook.pipeline import sharing

    config = node.need_config()
    if not config.mps.enabled:
        return [Result("mps", SKIP, "MPS not configured (no mps.gpus or mps.groups)")]
    inventory = node.inventory()
    if inventory is None:
        return [Result("mps", SKIP, "no inventory: the MPS share groups cannot be resolved")]
    try:
        groups = sharing.resolve_groups(config.mps, inventory, config.source)
    except GpuhookError as exc:
        return [Result("mps", FAIL, str(exc), f"fix mps.* in {config.source}")]
    results = [r for group in groups for r in _mps_group(config, group)]
    if not config.mps.exclusive_process:
        results.append(
            Result(
                "mps",
                WARN,
                "mps.exclusive_process is false: the MPS-shared GPUs stay in DEFAULT compute "
                "mode, so a tenant that unsets CUDA_MPS_PIPE_DIRECTORY leaves MPS and gets the "
                "whole GPU (all its SMs and memory, outside its limits)",
                f"set mps.exclusive_process: true in {config.source}, then: gpuhook mps start",
            )
        )
    return results


def _mps_group(config: Config, group: Any) -> list[Result]:
    from gpuhook.errors import GpuhookError
    from gpuhook.mps import admission, daemons

    pipe = group.pipe_dir(config.mps.root)
    pid = daemons.control_pid(pipe)
    what = f"MPS control daemon of group {group.name} (GPU {group.indices})"
    if pid is None:
        result = Result(
            "mps",
            FAIL,
            f"{what} is down ({pipe}); containers granted these GPUs are refused",
            f"gpuhook mps start {group.name} (or: systemctl start gpuhook-mps@{group.name})",
        )
    else:
        result = Result("mps", PASS, f"{what} running, pid {pid}")
    results = [result]
    blocked = admission.unsearchable(pipe)
    if blocked:
        results.append(Result("mps", WARN, admission.non_root_warning(group.name, blocked)))
    try:
        modes = daemons.compute_modes(config, group)
    except GpuhookError as exc:
        return [*results, Result("mps", WARN, f"compute mode of group {group.name}: {exc}")]
    problem = daemons.mode_problem(group.name, pid is not None, config.mps.exclusive_process, modes)
    if problem is not None:
        results.append(Result("mps", WARN, problem[0], problem[1]))
    return results


def _writable(folder: str) -> str:
    """Why files cannot be created in ``folder`` (nor it be created); "" when they can."""
    if os.path.isdir(folder):
        probe = os.path.join(folder, f".gpuhook-doctor-{os.getpid()}")
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            return f"cannot create files in {folder}: {exc.strerror}"
        return ""
    parent = folder
    while True:
        parent = os.path.dirname(parent)
        if os.path.lexists(parent) or parent in ("/", ""):
            break
    if not os.path.isdir(parent):
        return f"{folder} cannot be created: {parent} is not a folder"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{folder} does not exist and {parent} is not writable"
    return ""


@register("state dir")
def check_state_dir(node: Node) -> Result:
    config = node.need_config()
    for folder in (config.state_dir, config.records_dir):
        problem = _writable(folder)
        if problem:
            return Result(
                "state dir",
                FAIL,
                f"{problem}: no decision records are written (containers still start)",
                f"make {config.state_dir} a writable folder, or set state_dir in {config.source}",
            )
    return Result("state dir", PASS, f"{config.state_dir} is writable (inventory, containers/)")


@register("log dir")
def check_log_dir(node: Node) -> Result:
    config = node.need_config()
    if not config.log_file:
        return Result("log dir", SKIP, "log.file is empty: gpuhook writes no log file")
    folder = os.path.dirname(config.log_file)
    fix = f"make {folder} writable, or set log.file in {config.source}"
    problem = _writable(folder)
    if not problem and os.path.lexists(config.log_file):
        try:
            fd = os.open(config.log_file, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
            os.close(fd)
        except OSError as exc:
            problem = f"cannot append to {config.log_file}: {exc.strerror}"
    if problem:
        return Result("log dir", FAIL, f"{problem}: log events are lost", fix)
    return Result("log dir", PASS, f"{config.log_file} is writable")


@register("kubelet checkpoint")
def check_kubelet(node: Node) -> Result:
    from gpuhook import _fastjson
    from gpuhook.errors import CheckpointError
    from gpuhook.pipeline import kubelet

    config = node.need_config()
    name = "kubelet checkpoint"
    path = config.policy.checkpoint
    kubelet_dir = os.path.dirname(os.path.dirname(path))
    if not (os.path.lexists(path) or os.path.isdir(kubelet_dir)):
        return Result(name, SKIP, f"Kubernetes not detected ({kubelet_dir} not found)")
    mode = config.policy.kubernetes_env_requests
    if mode != "verify":
        return Result(name, SKIP, f"not used: policy.kubernetes.env_requests is {mode}")
    fix = (
        f"check policy.kubernetes.checkpoint in {config.source} and that the kubelet's device "
        "manager runs; until then Kubernetes env requests are refused"
    )
    try:
        with open(path, "rb") as fh:
            raw = fh.read(kubelet.MAX_CHECKPOINT_BYTES + 1)
        kubelet.allocation_from_bytes(raw, path, "", "")
    except FileNotFoundError:
        return Result(name, FAIL, f"{path} not found (Kubernetes detected: {kubelet_dir})", fix)
    except OSError as exc:
        return Result(name, FAIL, f"{path} unreadable: {exc.strerror}", fix)
    except CheckpointError as exc:
        return Result(name, FAIL, str(exc), fix)
    doc: Any = _fastjson.loads(raw)
    entries = doc["Data"].get("PodDeviceEntries") or []
    gpu = sum(
        1
        for e in entries
        if str(e.get("ResourceName", "")).startswith(kubelet.NVIDIA_RESOURCE_PREFIX)
    )
    return Result(name, PASS, f"{path} is readable ({gpu} nvidia.com/* allocations)")
