"""MPS control daemons (I/O): start, stop and status of ``nvidia-cuda-mps-control``.

One daemon per share group (:mod:`gpuhook.pipeline.sharing`), started as
``nvidia-cuda-mps-control -d`` from the inventory's driver binaries with an explicit environment
(never the caller's): ``CUDA_VISIBLE_DEVICES`` = the group's GPU UUIDs,
``CUDA_MPS_PIPE_DIRECTORY`` = ``<mps.root>/<group>/pipe``, ``CUDA_MPS_LOG_DIRECTORY`` =
``<mps.root>/<group>/log``. The group's share is set as the daemon's defaults through the
control interface (the same binary in client mode, one command per call).

The pipe folder is bind-mounted read-write into every MPS client container, so nothing in it is
trusted: not the daemon's own ``nvidia-cuda-mps-control.pid`` there, nor any link. gpuhook finds
the daemon it started in /proc (its argv[0], its ``CUDA_MPS_PIPE_DIRECTORY``, gpuhook's pid
namespace: a container's process has its own) and records its pid in
``<mps.root>/<group>/control.pid`` (root's, written atomically, beside the pipe folder, never
mounted). :func:`control_pid` (file and /proc reads, no subprocess) is what the container-create
path uses to tell that a daemon is up; every signal is sent only after the same check. Each
start gets a new, empty pipe folder: the folder a container had mounted (and may have filled
with links) is removed, never reused.

Compute mode (``mps.exclusive_process``, true by default): ``start`` puts the group's GPUs in
EXCLUSIVE_PROCESS through NVML, so that only the MPS server holds a context on them and a
client that leaves MPS (unsets ``CUDA_MPS_PIPE_DIRECTORY``) gets none, instead of the whole GPU.
``stop`` restores DEFAULT. Before it sets a mode, gpuhook writes ``<mps.root>/<group>/
compute-mode`` (root's, never mounted) and removes it once DEFAULT is back, so every step
converges after a crash of the daemon or of gpuhook itself: ``start`` sets the mode whether or
not a daemon runs, and a group whose file exists is put back to DEFAULT by ``stop`` (or by a
``start`` once the key is false) whatever the config says now.
"""

from __future__ import annotations

import os

from gpuhook.errors import GpuhookError, MpsError, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpuhook.config.types import Config
    from gpuhook.model.inventory import Inventory
    from gpuhook.pipeline.sharing import Group

CONTROL = "nvidia-cuda-mps-control"
RECORD = "control.pid"
MODE_RECORD = "compute-mode"
EXCLUSIVE = "EXCLUSIVE_PROCESS"
DEFAULT = "DEFAULT"
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0
COMMAND_TIMEOUT_S = 10.0
LOCK_TIMEOUT_S = 60.0
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


# --- liveness (hot path: os only) --------------------------------------------------------------


def record_path(pipe_dir: str) -> str:
    """gpuhook's record of the daemon's pid: beside the group's pipe folder, never in it."""
    return os.path.join(os.path.dirname(pipe_dir.rstrip("/")), RECORD)


def control_pid(pipe_dir: str) -> int | None:
    """The pid of the control daemon serving ``pipe_dir``, from gpuhook's record; None when
    there is no record, or its process is gone or is not that daemon (see :func:`serves`)."""
    pid = recorded_pid(pipe_dir)
    return pid if pid is not None and serves(pid, pipe_dir) else None


def recorded_pid(pipe_dir: str) -> int | None:
    """The pid in the record, whether or not it still runs; None for no (or no trusted) record:
    gpuhook's one rule for the files it acts on (:func:`gpuhook.config.cache.trusted_file`)."""
    from gpuhook.config.cache import trusted_file

    try:
        fd = os.open(record_path(pipe_dir), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not trusted_file(st):
            return None
        text = os.read(fd, 32).strip()
    except OSError:
        return None
    finally:
        os.close(fd)
    return int(text) if text.isdigit() and int(text) > 1 else None


def serves(pid: int, pipe_dir: str) -> bool:
    """Whether ``pid`` is an nvidia-cuda-mps-control (not a zombie) started with
    ``CUDA_MPS_PIPE_DIRECTORY=pipe_dir`` in this process's pid namespace (a container's process
    has its own, whatever argv and env it chose). Where its environ cannot be read (not root: a
    report only, never a signal), argv[0] alone is checked."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv0 = fh.read(4096).split(b"\0", 1)[0]
    except OSError:
        return False
    if os.path.basename(argv0) != CONTROL.encode():
        return False
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            environ = fh.read().split(b"\0")
        same_ns = os.readlink(f"/proc/{pid}/ns/pid") == os.readlink("/proc/self/ns/pid")
    except PermissionError:
        return os.geteuid() != 0
    except OSError:
        return False
    from gpuhook.pipeline.sharing import ENV_PIPE  # the create path has it (the MPS plan)

    return same_ns and f"{ENV_PIPE}={pipe_dir}".encode() in environ


def find_daemon(pipe_dir: str) -> int | None:
    """The control daemon serving ``pipe_dir`` found in /proc (no record needed): the lowest
    such pid, None when there is none. CLI only (a /proc scan)."""
    for entry in sorted((e for e in os.listdir("/proc") if e.isdigit()), key=int):
        if serves(int(entry), pipe_dir) and _daemonized(int(entry)):
            return int(entry)
    return None


def _daemonized(pid: int) -> bool:
    """A control daemon, not a client-mode call of the same binary (which has the same env)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read(4096).split(b"\0")
    except OSError:
        return False
    return len(argv) > 1 and argv[1] in (b"-d", b"-f")


# --- the daemon of one group --------------------------------------------------------------------


def binary(inventory: Inventory) -> str:
    """The control daemon executable of the inventory's driver."""
    for f in inventory.files_of("binary"):
        if f.name == CONTROL:
            return f.path
    raise MpsError(
        f"{CONTROL} is not in the driver root {inventory.driver_root} (inventory "
        "binaries); install the driver's compute utilities and run: gpuhook inventory refresh"
    )


class Daemon:
    """The control daemon of one share group: its folders, environment and control interface."""

    def __init__(self, config: Config, inventory: Inventory, group: Group) -> None:
        from gpuhook.pipeline.sharing import ENV_LOG, ENV_PIPE

        self.config = config
        self.group = group
        self.binary = binary(inventory)
        self.pipe_dir = group.pipe_dir(config.mps.root)
        self.log_dir = group.log_dir(config.mps.root)
        self.shm_dir = group.shm_dir(config.mps.root)  # with mps.shm: a tmpfs of the group's
        self.env = {
            "PATH": f"{os.path.dirname(self.binary)}:{SYSTEM_PATH}",
            "CUDA_VISIBLE_DEVICES": group.visible_devices(),
            ENV_PIPE: self.pipe_dir,
            ENV_LOG: self.log_dir,
        }
        if os.path.abspath(config.driver_root) != "/":
            # the MPS server loads libcuda: from the driver root, not from the host's search path
            folders = sorted(
                {
                    os.path.dirname(lib.path)
                    for lib in inventory.libraries
                    if lib.capability != "compat32"
                }
            )
            if folders:
                self.env["LD_LIBRARY_PATH"] = ":".join(folders)

    @property
    def label(self) -> str:
        what = "GPUs" if len(self.group.gpus) > 1 else "GPU"
        return f"{self.group.name} ({what} {self.group.indices})"

    def pid(self) -> int | None:
        """The running daemon of this group: the recorded one, else one found in /proc (a
        daemon started before gpuhook kept a record: adopted by the next start)."""
        return control_pid(self.pipe_dir) or find_daemon(self.pipe_dir)

    def send(self, command: str) -> str:
        """One command through the control interface; its reply. Raises MpsError."""
        import subprocess

        try:
            proc = subprocess.run(
                [self.binary],
                input=command + "\n",
                env=self.env,
                capture_output=True,
                text=True,
                timeout=COMMAND_TIMEOUT_S,
                cwd="/",
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise MpsError(
                f"{self.label}: {CONTROL} did not answer {command.partition(' ')[0]} within "
                f"{COMMAND_TIMEOUT_S:.0f}s"
            ) from None
        except OSError as exc:
            raise MpsError(f"{self.label}: cannot run {self.binary}: {exc.strerror}") from None
        if proc.returncode != 0:
            why = _last_line(proc.stderr) or _last_line(proc.stdout) or f"exit {proc.returncode}"
            raise MpsError(f"{self.label}: {command.partition(' ')[0]} failed: {why}")
        return proc.stdout

    def lock(self) -> Any:
        from gpuhook.fsutil import FileLock

        return FileLock(os.path.join(self.config.mps.root, self.group.name, "lock"), LOCK_TIMEOUT_S)

    def start(self) -> dict[str, Any]:
        """Start the daemon unless it runs, put the GPUs in the configured compute mode (also
        when it runs: a start converges), then set the group's share as its defaults. The
        folders a new daemon gets are made before any mode is set, and a start that fails after
        it set EXCLUSIVE_PROCESS puts DEFAULT back: never a GPU no process can use."""
        self._folders()
        with self.lock():
            pid = self.pid()
            if pid is None:
                self._forget()
            warnings = self._own_folders(fresh=pid is None)
            mode = self._converge_mode()
            state = "already running"
            if pid is None:
                try:
                    pid, state = self._start_new(), "started"
                except BaseException:
                    if mode == EXCLUSIVE:  # no daemon: leave the GPUs usable
                        self._restore_mode()
                    raise
            self._record(pid)
            defaults = self.group.default_commands()
            for command in defaults:
                self.send(command)
        from gpuhook.mps.admission import non_root_warning, unsearchable

        blocked = unsearchable(self.pipe_dir)
        return {
            **self._head(),
            "state": state,
            "pid": pid,
            "defaults_set": defaults,
            "compute_mode": mode,
            "warnings": warnings + [non_root_warning(self.group.name, b) for b in [blocked] if b],
        }

    def _folders(self) -> None:
        """The root, group, pipe and log folders, searchable by every uid whatever the umask:
        the daemon starts each client's MPS server as that client's uid, and the server must
        reach them. A folder above them that is not searchable is only reported."""
        created = not os.path.isdir(self.config.mps.root)
        group_dir = os.path.dirname(self.pipe_dir)
        os.makedirs(group_dir, mode=0o755, exist_ok=True)
        os.makedirs(self.log_dir, mode=0o755, exist_ok=True)
        for folder in ([self.config.mps.root] if created else []) + [group_dir, self.log_dir]:
            os.chmod(folder, 0o755)  # noqa: S103 - every MPS server's uid must search it

    def _converge_mode(self) -> str | None:
        """EXCLUSIVE_PROCESS under ``exclusive_process``; else DEFAULT back where gpuhook had
        set a mode (its record), else nothing touched (None)."""
        if self.config.mps.exclusive_process:
            self._set_mode(EXCLUSIVE)
            return EXCLUSIVE
        if os.path.lexists(self.mode_record):
            self._restore_mode()
            return DEFAULT
        return None

    def _start_new(self) -> int:
        self._spawn()
        pid: int | None = _wait(lambda: find_daemon(self.pipe_dir), START_TIMEOUT_S)
        if pid is None:
            raise MpsError(
                f"{self.label}: the control daemon did not come up within "
                f"{START_TIMEOUT_S:.0f}s; see {self.log_dir}/control.log"
            )
        return pid

    def _own_folders(self, fresh: bool) -> list[str]:
        """For a new daemon (``fresh``), a new pipe folder (and shm folder), each a tmpfs of the
        group's own (:mod:`gpuhook.mps.folders`): the ones client containers had mounted, and
        could fill, are detached, never walked. Warnings (for a running daemon: folders that
        are not its own filesystem, as an older gpuhook started it)."""
        from gpuhook.mps import folders

        mps = self.config.mps
        wanted = [(self.pipe_dir, folders.pipe_options(mps.pipe_size))]
        wanted += [(self.shm_dir, folders.shm_options(mps.shm_size))] if mps.shm else []
        if fresh:
            warnings = [w for path, options in wanted for w in folders.fresh_tmpfs(path, options)]
        else:
            warnings = folders.not_own([path for path, _ in wanted], self.group.name)
        return [f"{self.label}: {w}" for w in warnings]

    def _record(self, pid: int) -> None:
        from gpuhook.fsutil import atomic_write

        atomic_write(record_path(self.pipe_dir), f"{pid}\n".encode(), 0o644)

    def _forget(self) -> None:
        try:
            os.unlink(record_path(self.pipe_dir))
        except FileNotFoundError:
            pass

    def _spawn(self) -> None:
        import subprocess
        import tempfile

        from gpuhook.mps.folders import with_shm

        # stdout/stderr to a file, not a pipe: the daemonized child may keep them open
        with tempfile.TemporaryFile() as err:
            try:
                proc = subprocess.run(
                    [self.binary, "-d"],
                    env=self.env,
                    stdin=subprocess.DEVNULL,
                    stdout=err,
                    stderr=err,
                    cwd="/",
                    timeout=START_TIMEOUT_S,
                    check=False,
                    preexec_fn=with_shm(self.shm_dir) if self.config.mps.shm else None,
                )
            except subprocess.TimeoutExpired:
                raise MpsError(
                    f"{self.label}: {self.binary} -d did not return within {START_TIMEOUT_S:.0f}s"
                ) from None
            except (OSError, subprocess.SubprocessError) as exc:
                raise MpsError(f"{self.label}: cannot run {self.binary}: {exc}") from None
            if proc.returncode != 0:
                err.seek(0)
                why = _last_line(err.read().decode(errors="replace")) or "no message"
                raise MpsError(
                    f"{self.label}: {self.binary} -d failed (exit {proc.returncode}): {why}"
                )

    def stop(self) -> dict[str, Any]:
        """``quit`` through the control interface; a daemon that outlives it gets SIGTERM, then
        SIGKILL, each sent only while the pid still is this group's daemon (:func:`serves`).
        Afterwards no daemon of this group runs."""
        with self.lock():
            pid = self.pid()
            state = "not running"
            if pid is not None:
                try:
                    self.send("quit")
                except MpsError:
                    pass  # the signals below still stop it
                self._signal_until_gone(pid)
                state = "stopped"
            self._forget()
            from gpuhook.mps import folders

            for folder in (self.pipe_dir, self.shm_dir):  # containers keep what they mounted
                folders.detach(folder)
            mode = None
            if self.config.mps.exclusive_process or os.path.lexists(self.mode_record):
                self._restore_mode()
                mode = DEFAULT
        return {**self._head(), "state": state, "pid": pid, "compute_mode": mode}

    def _signal_until_gone(self, pid: int) -> None:
        import signal

        def gone() -> bool | None:
            return True if not serves(pid, self.pipe_dir) else None

        for sig, wait_s in ((None, STOP_TIMEOUT_S), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            if sig is not None and serves(pid, self.pipe_dir):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            if _wait(gone, wait_s):
                return
        raise MpsError(f"{self.label}: the control daemon (pid {pid}) did not stop")

    def status(self) -> dict[str, Any]:
        pid = self.pid()
        out: dict[str, Any] = {
            **self._head(),
            "state": "running" if pid is not None else "down",
            "pid": pid,
            "share": self.group.share_dict(),
            "defaults": None,
            "servers": None,
        }
        stale = recorded_pid(self.pipe_dir)
        if pid is None and stale is not None:
            out["note"] = f"stale pid record {record_path(self.pipe_dir)}: process {stale} is gone"
        if pid is not None:
            try:
                out["defaults"] = {
                    "active_thread_percentage": self.send(
                        "get_default_active_thread_percentage"
                    ).strip(),
                    "pinned_memory_limit": {
                        str(i): self.send(f"get_default_device_pinned_mem_limit {i}").strip()
                        for i in range(len(self.group.gpus))
                    },
                }
                servers = []
                for server in self.send("get_server_list").split():
                    clients = self.send(f"get_client_list {server}").split()
                    servers.append(
                        {"pid": int(server) if server.isdigit() else server, "clients": clients}
                    )
                out["servers"] = servers
            except MpsError as exc:
                out["error"] = str(exc)
        out["exclusive_process"] = self.config.mps.exclusive_process
        try:
            out["compute_modes"] = self.compute_modes()
        except GpuhookError as exc:
            out["compute_modes"] = None
            out["error"] = str(exc)
        else:
            exclusive = self.config.mps.exclusive_process
            problem = mode_problem(
                self.group.name, pid is not None, exclusive, out["compute_modes"]
            )
            if problem:
                out["compute_mode_note"] = f"{problem[0]}; run: {problem[1]}"
        return out

    def _head(self) -> dict[str, Any]:
        return {
            "group": self.group.name,
            "gpus": [{"index": g.index, "uuid": g.uuid} for g in self.group.gpus],
            "pipe_dir": self.pipe_dir,
            "log_dir": self.log_dir,
        }

    @property
    def mode_record(self) -> str:
        """gpuhook's record that it set the compute mode of this group's GPUs."""
        return os.path.join(self.config.mps.root, self.group.name, MODE_RECORD)

    def _set_mode(self, mode: str) -> None:
        """Record, then set: a crash between the two leaves a record that ``stop`` undoes."""
        from gpuhook.fsutil import atomic_write

        atomic_write(self.mode_record, f"{mode}\n".encode(), 0o644)
        self._compute_mode(mode)

    def _restore_mode(self) -> None:
        """DEFAULT on the group's GPUs, then forget the record."""
        self._compute_mode(DEFAULT)
        try:
            os.unlink(self.mode_record)
        except FileNotFoundError:
            pass

    def _compute_mode(self, mode: str) -> None:
        from gpuhook.inventory import nvml, store

        uuids = [g.uuid for g in self.group.gpus]
        try:
            nvml.set_compute_mode(
                self.config.nvml_library, store.nvml_candidates(self.config), uuids, mode
            )
        except GpuhookError as exc:
            raise MpsError(f"{self.label}: cannot set compute mode {mode}: {exc}") from None

    def compute_modes(self) -> dict[str, str]:
        return compute_modes(self.config, self.group)


def compute_modes(config: Config, group: Group) -> dict[str, str]:
    """GPU index -> compute mode of a group's GPUs, through NVML. Raises GpuhookError."""
    from gpuhook.inventory import nvml, store

    modes = nvml.compute_modes(
        config.nvml_library, store.nvml_candidates(config), [g.uuid for g in group.gpus]
    )
    return {str(g.index): modes.get(g.uuid, "?") for g in group.gpus}


def mode_problem(
    group: str, running: bool, exclusive: bool, modes: dict[str, str]
) -> tuple[str, str] | None:
    """What is wrong with the compute modes of a group (``modes``: GPU index -> mode) given
    whether its daemon runs and ``mps.exclusive_process``, and the fix; None when nothing is."""
    if running and exclusive:
        off = [i for i, m in modes.items() if m != EXCLUSIVE]
        if off:
            return (
                f"GPU {','.join(off)} is not in EXCLUSIVE_PROCESS compute mode while its MPS "
                "daemon runs: a tenant that unsets CUDA_MPS_PIPE_DIRECTORY gets the whole GPU",
                f"gpuhook mps start {group}",
            )
    if not running:
        held = [i for i, m in modes.items() if m == EXCLUSIVE]
        if held:
            return (
                f"GPU {','.join(held)} is in EXCLUSIVE_PROCESS compute mode with no MPS daemon: "
                "no CUDA process can use it",
                f"gpuhook mps start {group} (or gpuhook mps stop {group}: back to DEFAULT)",
            )
    return None


def _wait(probe: Any, timeout: float) -> Any:
    """Poll ``probe()`` until it returns something other than None, or ``timeout`` passes."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value is not None or time.monotonic() >= deadline:
            return value
        time.sleep(0.02)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


# --- what the CLI calls ---------------------------------------------------------------------------


def daemons(config: Config, inventory: Inventory, names: tuple[str, ...]) -> list[Daemon]:
    """The daemons of the groups named by group name, GPU index or UUID (all when empty)."""
    from gpuhook.pipeline import sharing

    if not config.mps.enabled:
        raise MpsError(f"no GPU is MPS-shared: set mps.gpus or mps.groups in {config.source}")
    groups = sharing.resolve_groups(config.mps, inventory, config.source)
    if not groups:
        raise MpsError(f"no GPU of this node is MPS-shared by {config.source} (mps.gpus)")
    return [Daemon(config, inventory, g) for g in select_groups(groups, names)]


def node_state(config: Config, inventory: Inventory) -> dict[str, Any]:
    """Per GPU index: MPS group and daemon state, for ``gpuhook inspect node`` (no subprocess).
    ``{"error": ...}`` when the config does not fit the node."""
    from gpuhook.pipeline import sharing

    if not config.mps.enabled:
        return {"gpus": {}}
    try:
        groups = sharing.resolve_groups(config.mps, inventory, config.source)
    except GpuhookError as exc:
        return {"gpus": {}, "error": str(exc)}
    out: dict[str, Any] = {}
    for group in groups:
        pipe = group.pipe_dir(config.mps.root)
        pid = control_pid(pipe)
        for gpu in group.gpus:
            out[str(gpu.index)] = {
                "group": group.name,
                "daemon": "running" if pid is not None else "down",
                "pid": pid,
                "pipe_dir": pipe,
            }
    return {"gpus": out}


def select_groups(groups: tuple[Group, ...], names: tuple[str, ...]) -> tuple[Group, ...]:
    """The groups named on the command line by group name, GPU index or GPU UUID (all groups
    when ``names`` is empty). Raises :class:`UsageError` for a name that is no shared GPU."""
    if not names:
        return groups
    chosen: dict[str, Group] = {}
    for name in names:
        lowered = name.strip().lower()
        match = next((g for g in groups if g.name.lower() == lowered), None)
        if match is None:
            match = next(
                (
                    g
                    for g in groups
                    for gpu in g.gpus
                    if (lowered.isdigit() and gpu.index == int(lowered))
                    or gpu.uuid.lower() == lowered
                ),
                None,
            )
        if match is None:
            shared = ", ".join(f"{g.name} (GPU {g.indices})" for g in groups) or "none"
            raise UsageError(f"{name!r} is not an MPS-shared GPU or share group (shared: {shared})")
        chosen[match.name] = match
    return tuple(g for g in groups if g.name in chosen)
