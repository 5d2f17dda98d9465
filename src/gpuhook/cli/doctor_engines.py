"""doctor's checks of what runs containers: the low-level runtime, the runtime service, the hook,
the engines' registration and the CDI spec they read."""

from __future__ import annotations

import os
import subprocess
from typing import TYPE_CHECKING

from gpuhook.cli.doctor_check import FAIL, PASS, SKIP, WARN, Node, Result, section
from gpuhook.config import locate
from gpuhook.engines import cdi, containerd_nri, readers
from gpuhook.errors import CdiError
from gpuhook.nri import defaults as nri_defaults
from gpuhook.nri import state as nri_state
from gpuhook.pipeline.inject import ldcache_program
from gpuhook.runtime import service

if TYPE_CHECKING:
    from typing import Any

    from gpuhook.config.types import Config
    from gpuhook.model.inventory import Inventory

register = section("mps")  # ahead of doctor_host


@register("runtime")
def check_runtime(node: Node) -> Result:
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
    runtime = ldcache_program(config, True)
    beside = f"gpuhook-runtime beside hook.path ({config.hook_path_source})"
    for key, path in (
        ("hook.path", config.hook_path),
        (beside, runtime),
        ("hook.ldconfig", config.ldconfig),
    ):
        if not locate.which(path):  # all absolute paths
            return Result(
                "hook",
                FAIL,
                f"{key} {path} is not an executable: GPU containers fail to start"
                + (f" ({config.hook_path_source})" if key == "hook.path" else ""),
                f"install it there or set hook.{'ldconfig' if 'ldconfig' in key else 'path'} "
                f"in {config.source}",
            )
    runs = f"{config.hook_path} hook update-ldcache ({config.hook_path_source})"
    if runtime != config.hook_path:
        runs = (
            f"{runtime} hook update-ldcache (the containers gpuhook-runtime creates); "
            f"{runs} for CDI specs and log level debug"
        )
    return Result("hook", PASS, f"{runs}, with {config.ldconfig}")


def _nri_plugin(node: Node) -> dict[str, Any] | None:
    """The running NRI plugin's status (``gpuhook nri``), None when none runs."""
    return nri_state.running(node.config) if node.config is not None else None


def _nri_mode(node: Node, reg: readers.Registration) -> Result | None:
    """containerd in NRI mode: gpuhook's plugin runs and no gpuhook runtime is registered."""
    plugin = _nri_plugin(node) if reg.engine == readers.CONTAINERD else None
    if plugin is None or not reg.exists or reg.error or reg.gpuhook_runtimes:
        return None
    return Result(
        reg.engine,
        PASS,
        f"NRI mode: gpuhook's NRI plugin {plugin.get('plugin')} decides containerd's "
        f"containers (no runtime registered in {reg.path}; see the nri check)",
    )


# What a containerd config version says about the containerd that reads it.
CONTAINERD_VERSIONS = {
    2: "config version 2: containerd 1.x; 2.x migrates it",
    3: "config version 3: containerd 2.0-2.2; 2.3 migrates it",
    4: "config version 4: containerd 2.3+",
}


def _engine_result(node: Node, engine: str) -> Result:
    result = _registration_result(node, engine)
    version = node.engine(engine).version
    if engine != readers.CONTAINERD or version not in CONTAINERD_VERSIONS or result.status == SKIP:
        return result
    return Result(
        result.check,
        result.status,
        f"{result.message} ({CONTAINERD_VERSIONS[version]})",
        result.fix,
    )


def _registration_result(node: Node, engine: str) -> Result:
    reg = node.engine(engine)
    nri_mode = _nri_mode(node, reg)
    if nri_mode is not None:
        return nri_mode
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
    if any(r.gpuhook_runtimes for r in regs) or _nri_plugin(node) is not None:
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


@register("nri")
def check_nri(node: Node) -> Result:
    """NRI mode (docs/nri.md): the plugin runs, containerd's NRI is on at its socket, and its
    default validator requires the plugin (else a plugin that is down fails open)."""
    plugin = _nri_plugin(node)
    if plugin is None:
        return Result("nri", SKIP, "no gpuhook NRI plugin runs (runtime mode)")
    name = str(plugin.get("plugin", "gpuhook"))
    where = f"plugin {name} (pid {plugin['pid']}) on {plugin.get('socket')}"
    path = node.engine_paths[readers.CONTAINERD]
    settings = containerd_nri.read(path)
    if settings.error:
        return Result("nri", WARN, f"{where}; {path}: {settings.error}", f"repair {path}")
    if not settings.enabled:
        table = f"[plugins.'{containerd_nri.NRI_PLUGIN}']"
        fix = f"set disable = false in {table} of {path}, then: systemctl restart containerd"
        return Result("nri", FAIL, f"{where}, but NRI is disabled in {path}", fix)
    if not settings.requires(name.partition("-")[2] or name):
        return Result(
            "nri",
            WARN,
            f"{where}; containerd does not require it: while it is down or restarting, "
            "containers are created without gpuhook's decision (NRI fails open)",
            f"in {path}: [plugins.'{containerd_nri.NRI_PLUGIN}'.default_validator] enable = true,"
            f" required_plugins = ['{nri_defaults.NAME}'], then: systemctl restart containerd",
        )
    return Result("nri", PASS, f"{where}; containerd requires it (fail closed)")


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
