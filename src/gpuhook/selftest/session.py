"""One self test run: its temp folder, the runtimes it drives, every container it made, and
the cleanup that leaves nothing behind.

Layout of the temp folder (under ``state_dir`` where it is writable, else ``$TMPDIR``; mode
0700): ``rootfs/`` the template, ``root/`` the private runc ``--root`` (gpuhook-runtime's and
plain runc's), ``containers/NN-<check>[-runc]/`` one bundle per container, ``cuda/`` the built
CUDA program. Outside it a run makes only what gpuhook-runtime makes for any container: the
record link ``<state_dir>/containers/<id>.json`` and the exec-env marker, both removed with the
container.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import tempfile
import time
from typing import TYPE_CHECKING

from gpuhook.config import locate
from gpuhook.config.types import ENV_CONFIG
from gpuhook.errors import GpuhookError
from gpuhook.model.frozen import Frozen, _init
from gpuhook.records import execenv, lookup
from gpuhook.records.ids import link_path
from gpuhook.selftest import bundle, lifecycle, rootfs
from gpuhook.selftest.report import FAIL, PASS, SKIP, Result, Timing

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    from gpuhook.config.types import Config
    from gpuhook.model.inventory import Inventory
    from gpuhook.model.record import Record
    from gpuhook.selftest.bundle import Seen
    from gpuhook.selftest.cuda import Program

CONTAINER_TIMEOUT_S = 120.0
KILL_TIMEOUT_S = 10.0
ID_PREFIX = "gpuhook-selftest"


class Options(Frozen):
    """What the operator asked for: ``gpus`` (``--gpu``: ids; empty: every GPU and MIG
    device), ``cuda`` and ``cuda_program``, ``runtime`` (the gpuhook-runtime to test; "" for
    the one installed beside this gpuhook)."""

    gpus: tuple[str, ...] = ()
    cuda: bool = False
    cuda_program: str = ""
    runtime: str = ""


class Container(Frozen):
    """One container the self test ran through gpuhook-runtime: how it went, what its probe
    saw, and its decision record as ``gpuhook inspect container`` finds it (None, with
    ``record_problem``, when it is not found)."""

    container_id: str
    bundle: str
    ran: lifecycle.Ran
    seen: Seen
    record: Record | None
    record_problem: str

    def __init__(
        self,
        container_id: str,
        bundle_dir: str,
        ran: lifecycle.Ran,
        seen: Seen,
        record: Record | None,
        record_problem: str,
    ) -> None:
        _init(
            self,
            container_id=container_id,
            bundle=bundle_dir,
            ran=ran,
            seen=seen,
            record=record,
            record_problem=record_problem,
        )


def gpuhook_runtime(given: str) -> str:
    """The gpuhook-runtime to test: ``given``, else the one beside the running gpuhook (the
    same installation: /usr/bin, /opt/gpuhook/bin, a virtualenv), else the one on PATH."""
    if given:
        return os.path.abspath(given)
    program = locate.running_program()
    if program:
        return os.path.join(os.path.dirname(program), "gpuhook-runtime")
    return locate.which("gpuhook-runtime") or "/usr/bin/gpuhook-runtime"


def work_parent(config: Config) -> str | None:
    """Where the temp folder goes: state_dir when it is a writable folder (hosts often mount
    /tmp noexec, and the containers execute from their rootfs), else $TMPDIR."""
    if os.path.isdir(config.state_dir) and os.access(config.state_dir, os.W_OK | os.X_OK):
        return config.state_dir
    return None


class Session:
    """The runtimes, the rootfs template and every container of one run."""

    def __init__(self, config: Config, options: Options) -> None:
        self.config = config
        self.options = options
        self.work_dir = tempfile.mkdtemp(prefix=f"{ID_PREFIX}-", dir=work_parent(config))
        self.root = os.path.join(self.work_dir, "root")
        env = {k: v for k, v in os.environ.items() if k != locate.ENV_SELF}
        if config.source.startswith("/"):
            env[ENV_CONFIG] = config.source
        self.env = env
        self.gpuhook = lifecycle.Runtime(gpuhook_runtime(options.runtime), self.root, env)
        self.runc = lifecycle.Runtime(config.runtime, self.root, env) if config.runtime else None
        self.inventory: Inventory | None = None
        self.rootfs: rootfs.Rootfs | None = None
        self.cuda: Program | None = None
        self.smi = ""  # the injected programs' paths in a container ("" when not injected)
        self.mps_control = ""
        self.timings: list[Timing] = []
        self.live: list[tuple[lifecycle.Runtime, str]] = []  # created, not deleted yet
        self.ids: list[str] = []  # every id given to gpuhook-runtime
        self.created = 0  # containers created (both runtimes)
        self.recorded: set[str] = set()  # containers whose record link this run saw
        self.ran = 0
        self.failures: dict[str, str] = {}  # create failure line -> the check that saw it
        # gpuhook-runtime makes these for the first GPU container; removed again when empty
        made_by_creates = (
            config.records_dir,
            os.path.join(config.state_dir, execenv.DIR),
            config.state_dir,
        )
        self.new_folders = [f for f in made_by_creates if not os.path.lexists(f)]

    def runtimes(self) -> dict[str, str]:
        return {"gpuhook-runtime": self.gpuhook.path, "runc": self.runc.path if self.runc else ""}

    def container(
        self, check: str, annotations: Mapping[str, str], env: Sequence[str], *, gpu: bool = True
    ) -> Container:
        """Run the probe in a container through gpuhook-runtime, then in plain runc on the same
        bundle (its timing); read its record, delete both. ``gpu`` False: a spec without any
        GPU marker (the probe lists device nodes only)."""
        self.ran += 1
        cid = f"{ID_PREFIX}-{os.getpid()}-{self.ran:02d}"
        name = f"{self.ran:02d}-{check.replace(' ', '-').replace(':', '-')}"
        cuda = rootfs.CUDA_PROGRAM if self.cuda is not None and self.cuda.path else ""
        programs = (self.smi, self.mps_control, cuda) if gpu else ("", "", "")
        script = bundle.probe(*programs, env=gpu)
        data = bundle.spec(("/bin/sh", "-c", script), env, annotations, f"/{cid}")
        path = self._bundle(name, data)
        self.ids.append(cid)
        ran = self._run(self.gpuhook, path, cid)
        record, problem = self._record(cid) if ran.created or not ran.error else (None, "")
        self._delete(self.gpuhook, cid)
        self._forget_record(cid)
        plain: lifecycle.Ran | None = None
        if self.runc is not None and not ran.error:
            data["linux"]["cgroupsPath"] = f"/{cid}-runc"
            plain_path = self._bundle(name + "-runc", data)
            plain = self._run(self.runc, plain_path, cid + "-runc")
            self._delete(self.runc, cid + "-runc")
        if ran.create_s is not None:
            runc_s = plain.create_s if plain is not None and plain.code == 0 else None
            self.timings.append(Timing(check, cid, ran.create_s, runc_s))
        return Container(cid, path, ran, bundle.parse(ran.stdout), record, problem)

    def _bundle(self, name: str, data: dict[str, Any]) -> str:
        if self.rootfs is None:
            raise RuntimeError("the rootfs template is not built")
        path = os.path.join(self.work_dir, "containers", name)
        os.makedirs(path)
        rootfs.clone(self.rootfs.path, os.path.join(path, "rootfs"))
        bundle.write_spec(path, data)
        return path

    def _run(self, runtime: lifecycle.Runtime, path: str, cid: str) -> lifecycle.Ran:
        self.live.append((runtime, cid))
        ran = runtime.run(path, cid, CONTAINER_TIMEOUT_S)
        if ran.created:
            self.created += 1
        else:
            self.live.remove((runtime, cid))
        if _points_into(link_path(self.config.records_dir, cid), self.work_dir):
            self.recorded.add(cid)  # gone by cleanup: removed by the delete, a sweep, or us
        return ran

    def _delete(self, runtime: lifecycle.Runtime, cid: str) -> str:
        if (runtime, cid) not in self.live:
            return ""
        problem = runtime.delete(cid)
        if not problem:
            self.live.remove((runtime, cid))
        return problem

    def _record(self, cid: str) -> tuple[Record | None, str]:
        """The container's record as ``gpuhook inspect container`` finds it."""

        try:
            entry = lookup.find(self.config, cid)
        except GpuhookError as exc:
            return None, str(exc)
        return entry.record, ""

    def _forget_record(self, cid: str) -> str:
        """Remove the container's record link and exec-env marker (gpuhook-runtime's delete
        removes the marker; an interrupted run may leave it). Only links into this run's temp
        folder are touched. Returns what could not be removed ("" when nothing is left)."""

        link = link_path(self.config.records_dir, cid)
        if _points_into(link, self.work_dir):
            self.recorded.add(cid)
            try:
                os.unlink(link)
            except OSError as exc:
                return f"record link {link}: {exc.strerror}"
        execenv.forget(self.config.state_dir, cid)
        marker = execenv.marker_path(self.config.state_dir, cid)
        return f"exec-env marker {marker}" if marker and os.path.lexists(marker) else ""

    def failed(self, check: str, container: Container) -> Result | None:
        """The line for a container that did not run its probe to the end; None when it did.
        A create failure seen before (the same line) is reported once: later checks that hit
        it are skipped with a pointer to the first."""
        ran = container.ran
        if not ran.error and container.seen.done and ran.code in (0, None):
            return None
        if ran.error:
            earlier = self.failures.get(ran.error)
            if earlier is not None:
                return Result(check, SKIP, f"not judged: failed as {earlier} did")
            self.failures[ran.error] = check
            verb = "did not run" if ran.created else "create failed"
            return Result(check, FAIL, f"{verb}: {ran.error}", fix_for(ran.error, self.config))
        why = ran.stderr.strip().splitlines()[-1:] or ["no output on stderr"]
        return Result(
            check,
            FAIL,
            f"the container exited with {ran.code} before its probe ended: {why[0]}",
            "gpuhook doctor (each broken part with its fix)",
        )

    def cleanup(self) -> Result:
        """Delete what is left, remove the record links and the temp folder; say what could
        not be removed."""
        problems = []
        for runtime, cid in list(self.live):
            problem = self._delete(runtime, cid)
            if problem:
                problems.append(f"container {cid} under {self.root}: {problem}")
        problems += [p for p in (self._forget_record(cid) for cid in self.ids) if p]
        problems += remove_cgroups([n for cid in self.ids for n in (cid, f"{cid}-runc")])
        lister = self.runc or self.gpuhook
        left = lister.listed()
        if left:
            problems.append(f"{lister.path} --root {self.root} still lists {', '.join(left)}")
        if not problems:
            try:
                shutil.rmtree(self.work_dir)
            except OSError as exc:
                problems.append(f"{self.work_dir}: {exc.strerror}")
        for folder in self.new_folders:
            try:
                os.rmdir(folder)  # only when empty: a real container's record stays
            except OSError:
                pass
        if problems:
            return Result(
                "cleanup",
                FAIL,
                "left behind: " + "; ".join(problems),
                f"runc --root {self.root} delete --force <id>, then rm -rf {self.work_dir}",
            )
        return Result(
            "cleanup",
            PASS,
            f"deleted its {self.created} containers, removed their {len(self.recorded)} record "
            f"links and {self.work_dir}",
        )


def remove_cgroups(names: list[str]) -> list[str]:
    """Remove the cgroups ``/<name>`` a runtime left in any cgroup hierarchy, killing what
    still runs in them first (a create that was interrupted leaves its cgroup behind, and may
    leave runc's init waiting there); what could not be removed."""
    paths = [
        os.path.join(mount, name)
        for mount in cgroup_mounts()
        for name in names
        if os.path.isdir(os.path.join(mount, name))
    ]
    if not paths:
        return []
    deadline = time.monotonic() + KILL_TIMEOUT_S
    while True:
        alive = [pid for path in paths for pid in _procs(path)]
        if not alive or time.monotonic() > deadline:
            break
        for pid in set(alive):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        lifecycle.reap_orphans()
        time.sleep(0.02)
    problems = []
    for path in paths:
        try:
            os.rmdir(path)
        except OSError as exc:
            problems.append(f"cgroup {path}: {exc.strerror}")
    return problems


def _procs(cgroup: str) -> list[int]:
    try:
        with open(os.path.join(cgroup, "cgroup.procs")) as fh:
            return [int(p) for p in fh.read().split()]
    except (OSError, ValueError):
        return []


def cgroup_mounts() -> list[str]:
    """The mount points of the cgroup hierarchies (v1 and v2) this process sees."""
    try:
        with open("/proc/self/mountinfo") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        fields, _, rest = line.partition(" - ")
        if rest.split(" ", 1)[0] in ("cgroup", "cgroup2"):
            found.append(fields.split(" ")[4].replace("\\040", " "))
    return found


def _points_into(link: str, folder: str) -> bool:
    try:
        return os.readlink(link).startswith(folder + "/")
    except OSError:
        return False


def fix_for(error: str, config: Config) -> str:
    """The fix for a create that failed with ``error`` (gpuhook's own lines name theirs)."""
    if "error running hook" in error or config.hook_path in error:
        return (
            f"make {config.hook_path} executable (and {config.ldconfig}), or set hook.path in "
            f"{config.source}"
        )
    group = re.search(r"MPS control daemon .*\(group ([\w.+-]+)\)", error)
    if group:
        name = group.group(1)
        return f"gpuhook mps start {name} (or: systemctl start gpuhook-mps@{name})"
    if "low-level OCI runtime" in error or (config.runtime and config.runtime in error):
        return f"install runc, or set runtime.path in {config.source} to it"
    return "gpuhook doctor (each broken part with its fix)"


class Interrupted(GpuhookError):
    """SIGINT, SIGTERM or SIGHUP during the run: the cleanup still runs; exit 128 + signal."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def on_signals() -> dict[int, Any]:
    """Turn SIGINT, SIGTERM and SIGHUP into :class:`Interrupted`; the handlers they replace."""

    def interrupt(signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        raise Interrupted(f"selftest: interrupted by {name}", signum)

    return {s: signal.signal(s, interrupt) for s in SIGNALS}


def hold_signals() -> None:
    """Let those signals no longer interrupt (the cleanup must finish). A handler, not SIG_IGN:
    the programs the cleanup runs get the default dispositions."""
    for signum in SIGNALS:
        signal.signal(signum, _ignore)


def _ignore(_signum: int, _frame: object) -> None:
    return None


def restore_signals(previous: dict[int, Any]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)
