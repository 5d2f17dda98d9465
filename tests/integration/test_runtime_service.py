"""The runtime service (`gpuhook runtime serve`) as the dispatcher uses it, on the fake node with
real runc: a create through the service writes what the shim process writes, the container
starts with what it was granted, a refused create is one line on the caller's stderr, callers
of another user, namespace or capability set are declined, many creates at once are all
answered, and SIGTERM removes the socket.

The dispatcher's side is tests/runtime_service.py (``request`` in this process, or the file run
as a dispatcher script in another process, context or user)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import testbed

from gpuhook.config import loading as config_loading
from gpuhook.records import execenv, writer
from gpuhook.runtime import dispatch, prefault, service, wire
from gpuhook.runtime.pool import POOL
from tests import factories as f
from tests.conftest import Containers, FakeNode, recorder, recorder_env
from tests.integration.test_hot_path_imports import OPERATOR_LOG
from tests.integration.test_hot_path_imports import create as create_with_importtime
from tests.integration.test_leak_matrix import gpus, uuid, write_checkpoint
from tests.runtime_service import (
    DECLINED_EXIT,
    RuntimeService,
    dispatcher_script,
    request,
)

pytestmark = pytest.mark.root

REPO = Path(__file__).resolve().parents[2]
ENTRY = REPO / "src" / "gpuhook" / "_shim_entry.py"
CLIENT = REPO / "tests" / "runtime_service.py"
Start = Callable[..., RuntimeService]


# the leak case: image env all, a Kubernetes container, a checkpoint that allocates it nothing;
# and a container asking for GPU 1 through its env
CASES: dict[str, dict[str, Any]] = {
    "leak": {"env": ["NVIDIA_VISIBLE_DEVICES=all"], "annotations": f.k8s()},
    "gpu1": {"env": ["NVIDIA_VISIBLE_DEVICES=1"]},
}


def leak_policy(node: FakeNode, folder: Path) -> dict[str, Any]:
    """The policy section whose checkpoint allocates GPU 0 to another pod, nothing to ours."""
    folder.mkdir(parents=True, exist_ok=True)
    checkpoint = write_checkpoint(
        folder / "kubelet_internal_checkpoint", [("other-pod", "main", [uuid(node, 0)])]
    )
    return {"kubernetes": {"checkpoint": str(checkpoint)}}


def case_env(node: FakeNode, folder: Path, case: str, **sections: Any) -> dict[str, str]:
    """The node's config for ``case`` (the leak case's checkpoint), with ``sections``."""
    if case == "leak":
        sections["policy"] = leak_policy(node, folder)
    return node.variant(folder, **sections)


@pytest.fixture
def pipes(tmp_path: Path) -> Iterator[tuple[int, int, int]]:
    """stdin (/dev/null), stdout and stderr (files) as a caller would pass them."""
    fds = (
        os.open(os.devnull, os.O_RDONLY),
        os.open(tmp_path / "stdout", os.O_RDWR | os.O_CREAT, 0o600),
        os.open(tmp_path / "stderr", os.O_RDWR | os.O_CREAT, 0o600),
    )
    yield fds
    for fd in fds:
        os.close(fd)


def read_fd(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, 1 << 20).decode()


def shim_process(
    argv: list[str], env: dict[str, str], cwd: Path
) -> subprocess.CompletedProcess[str]:
    """The shim as the dispatcher starts it without the service."""
    return subprocess.run(
        [sys.executable, "-I", "-S", str(ENTRY), *argv],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def normalized(text: str, bundle: Path, cid: str) -> str:
    return text.replace(str(bundle), "<bundle>").replace(cid, "<id>")


def record_of(bundle: Path, cid: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        normalized((bundle / writer.RECORD_NAME).read_text(), bundle, cid)
    )
    data.pop("timestamp")
    data["timing"].pop("seconds")  # the path stays: who decided
    return data


def events_of(log: Path, bundle: Path, cid: str) -> list[dict[str, Any]]:
    events = []
    for line in log.read_text().splitlines():
        event = json.loads(normalized(line, bundle, cid))
        if event.get("container_id") == "<id>":
            event.pop("timestamp")
            events.append(event)
    return events


# --- what the service writes is what the shim process writes --------------------------------------


@pytest.mark.parametrize("case", ["leak", "gpu1"])
def test_a_create_through_the_service_writes_what_the_shim_process_writes(
    node: FakeNode,
    containers: Containers,
    tmp_path: Path,
    runtime_service: Start,
    pipes: tuple[int, int, int],
    case: str,
) -> None:
    """Same bundle, same argv, env and working folder: the service's reply names the runtime
    the process execs (a recorder), and config.json, the record, the record link and the log
    events are the same but for the bundle path, the id and the time."""
    folder = tmp_path / "cfg"
    fake, argv_file = recorder(folder)
    log = tmp_path / "gpuhook.log"
    config = case_env(
        node, folder, case, runtime={"path": str(fake)}, log={"level": "debug", "file": str(log)}
    )
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "GPUHOOK_CONFIG": config["GPUHOOK_CONFIG"],
        "GPUHOOK_CACHE_DIR": config["GPUHOOK_CACHE_DIR"],
    }
    svc = runtime_service(node.env)  # its own config; each request names its own
    by_process, by_service = containers.bundle(**CASES[case]), containers.bundle(**CASES[case])
    runc_log = "runc.log"  # relative: the caller's working folder is where it goes

    def argv(bundle: Path, cid: str) -> list[str]:
        return ["--root", "/r", "--log", runc_log, "create", "--bundle", str(bundle), cid]

    process = shim_process(argv(by_process, "proc-1"), env, tmp_path)
    assert (process.returncode, process.stdout, process.stderr) == (42, "", "")
    recorded = argv_file.read_text()
    reply = svc.request(
        ["gpuhook-runtime", *argv(by_service, "svc-1")], env, cwd=tmp_path, stdio=pipes
    )
    assert reply.kind == wire.EXEC, reply
    assert reply.text == str(fake)  # the recorder never ran for it: the caller execs it
    assert argv_file.read_text() == recorded
    assert (read_fd(pipes[1]), read_fd(pipes[2])) == ("", "")

    spec_p = normalized((by_process / "config.json").read_text(), by_process, "proc-1")
    spec_s = normalized((by_service / "config.json").read_text(), by_service, "svc-1")
    assert spec_s == spec_p
    by_svc, by_proc = record_of(by_service, "svc-1"), record_of(by_process, "proc-1")
    assert (by_svc.pop("timing"), by_proc.pop("timing")) == (
        {"path": "service"},
        {"path": "python"},
    )
    assert by_svc == by_proc
    state = Path(node.truth["state_dir"]) / "containers"
    assert os.readlink(state / "svc-1.json") == str(by_service / writer.RECORD_NAME)
    assert events_of(log, by_service, "svc-1") == events_of(log, by_process, "proc-1")
    assert events_of(log, by_service, "svc-1")  # at least the decision
    visible = [e for e in json.loads(spec_s)["process"]["env"] if "VISIBLE" in e]
    want = "void" if case == "leak" else uuid(node, 1)
    assert visible == [f"NVIDIA_VISIBLE_DEVICES={want}"]
    assert not (tmp_path / runc_log).exists()  # no failure, no runc-format line


# --- real containers through the service ----------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("case", ["leak", "gpu1"])
def test_a_container_created_through_the_service_sees_what_it_was_granted(
    node: FakeNode, containers: Containers, tmp_path: Path, runtime_service: Start, case: str
) -> None:
    """The dispatcher script execs the runc the service names, with its own argv: runc run
    starts the container, which sees exactly its grant."""
    env = case_env(node, tmp_path / "cfg", case)
    svc = runtime_service(node.env)
    reply_file = tmp_path / "reply"
    runtime = dispatcher_script(tmp_path / "gpuhook-runtime", svc.socket, reply_file)
    seen = containers.probe(env, runtime=str(runtime), **CASES[case])
    assert seen["returncode"] == 0, seen["stderr"]
    runc = node.truth.get("runtime") or shutil.which("runc")
    assert reply_file.read_bytes() == wire.EXEC + os.fsencode(os.path.realpath(str(runc)))
    if case == "leak":
        assert seen["dev"] == []
        assert seen["env"]["NVIDIA_VISIBLE_DEVICES"] == "void"
        assert seen["ldconfig"] == []
    else:
        assert seen["dev"] == gpus(1)
        assert seen["env"]["NVIDIA_VISIBLE_DEVICES"] == uuid(node, 1)
        assert seen["smi"][-1] == "rc=0"
    record = json.loads((seen["bundle"] / writer.RECORD_NAME).read_text())
    assert record["container_id"] == seen["container_id"]
    assert record["decision"]["refused"] is (case == "leak")


@pytest.mark.slow
def test_an_exec_through_the_service_gets_the_granted_environment(
    node: FakeNode, containers: Containers, tmp_path: Path, runtime_service: Start
) -> None:
    """``run -d`` and ``exec --process`` both through the service: the exec'd process gets the
    granted NVIDIA_VISIBLE_DEVICES (the exec-env marker), not the image's ``all``."""
    svc = runtime_service(node.env)
    reply_file = tmp_path / "reply"
    runtime = dispatcher_script(tmp_path / "gpuhook-runtime", svc.socket, reply_file)
    state = str(containers.state)
    bundle = containers.bundle(args=("/bin/sh", "-c", "sleep 30"), env=["NVIDIA_VISIBLE_DEVICES=2"])
    env = {"PATH": os.environ["PATH"], **node.env}
    cid = "svc-exec"

    def call(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(runtime), "--root", state, *args],
            env=env,
            cwd="/",
            text=True,
            check=False,
            stdin=subprocess.DEVNULL,
            timeout=60,
            **kw,
        )

    # the detached container keeps its stdio: not pipes this test would wait on
    started = call("run", "-d", "--bundle", str(bundle), cid, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)  # fmt: skip
    assert started.returncode == 0
    assert reply_file.read_bytes().startswith(wire.EXEC)
    process = tmp_path / "process.json"
    process.write_text(
        json.dumps(
            {
                "args": ["/bin/sh", "-c", "env | grep ^NVIDIA_VISIBLE || true"],
                "env": ["PATH=/bin:/usr/bin", "NVIDIA_VISIBLE_DEVICES=all"],
                "cwd": "/",
                "user": {"uid": 0, "gid": 0},
            }
        )
    )
    reply_file.unlink()  # the run's reply: what follows is the exec's
    try:
        out = call("exec", "--process", str(process), cid, capture_output=True)
        assert (out.returncode, out.stdout) == (0, f"NVIDIA_VISIBLE_DEVICES={uuid(node, 2)}\n")
        assert reply_file.read_bytes().startswith(wire.EXEC)  # the exec went to the service
    finally:  # through the process shim: it also removes the exec-env marker
        subprocess.run(
            [testbed.RUNTIME, "--root", state, "delete", "-f", cid], env=env, check=False
        )
    assert not Path(execenv.marker_path(node.truth["state_dir"], cid)).exists()


@pytest.mark.slow
def test_a_refused_create_is_one_line_on_the_callers_stderr(
    node: FakeNode, containers: Containers, tmp_path: Path, runtime_service: Start
) -> None:
    """R and the shim's exit code; its line on the stderr the caller passed and in runc's --log,
    as from the shim process; the spec untouched."""
    svc = runtime_service(node.env)
    bundle = containers.bundle(env=["NVIDIA_VISIBLE_DEVICES=GPU-nope"])
    before = (bundle / "config.json").read_text()
    reply_file = tmp_path / "reply"
    runtime = dispatcher_script(tmp_path / "gpuhook-runtime", svc.socket, reply_file)
    log = tmp_path / "runc.json"
    argv = ["--log", str(log), "--log-format", "json", "create", "--bundle", str(bundle), "c1"]
    out = subprocess.run(
        [str(runtime), *argv],
        env={**os.environ, **node.env},
        capture_output=True,
        text=True,
        check=False,
    )
    line = "gpuhook: env NVIDIA_VISIBLE_DEVICES: unknown GPU UUID GPU-nope (this node has GPUs 0-7)"
    assert (out.returncode, out.stdout, out.stderr) == (1, "", line + "\n")
    assert reply_file.read_bytes() == wire.EXIT + b"1"
    [entry] = [json.loads(x) for x in log.read_text().splitlines()]
    assert (entry["level"], entry["msg"]) == ("error", line)
    assert (bundle / "config.json").read_text() == before
    process_log = tmp_path / "process.json"
    process = shim_process(
        [
            "--log",
            str(process_log),
            "--log-format",
            "json",
            "create",
            "--bundle",
            str(bundle),
            "c2",
        ],
        {**os.environ, **node.env},
        tmp_path,
    )
    assert (process.returncode, process.stderr) == (out.returncode, out.stderr)
    assert json.loads(process_log.read_text())["msg"] == entry["msg"]


def test_a_runtime_that_is_not_executable_is_the_shims_failure_line(
    node: FakeNode, containers: Containers, tmp_path: Path, runtime_service: Start
) -> None:
    """The service checks the runtime before it names it; where the shim's execv would fail,
    the caller gets the shim's line, not an exec that fails in the dispatcher."""
    runtime, _ = recorder(tmp_path / "cfg")
    env = node.variant(tmp_path / "cfg", runtime={"path": str(runtime)})
    svc = runtime_service(env)
    bundle = containers.bundle(env=["NVIDIA_VISIBLE_DEVICES=0"])
    shim_process(["list"], {**os.environ, **env}, tmp_path)  # the config's cache names it
    runtime.chmod(0o644)
    err = os.open(tmp_path / "stderr", os.O_RDWR | os.O_CREAT, 0o600)
    null = os.open(os.devnull, os.O_RDWR)
    try:
        reply = svc.request(
            ["gpuhook-runtime", "create", "--bundle", str(bundle), "c1"], stdio=(null, null, err)
        )
        process = shim_process(["create", "--bundle", str(bundle), "c2"], svc.env, tmp_path)
    finally:
        os.close(err)
        os.close(null)
    line = f"gpuhook: cannot execute {runtime}: Permission denied\n"
    assert (reply.kind, reply.text) == (wire.EXIT, "1")
    assert (tmp_path / "stderr").read_text() == line
    assert (process.returncode, process.stderr) == (1, line)


# --- callers the service declines -----------------------------------------------------------------


DECLINED = [
    (["unshare", "-m"], "is in another mnt namespace"),
    (["unshare", "-p", "-f"], "is in another pid namespace"),
    (["unshare", "-U", "-r"], "is in another user namespace"),
    (["setpriv", "--bounding-set", "-sys_admin"], "lacks capabilities of the service (0x200000)"),
    (["setpriv", "--no-new-privs"], "runs under no_new_privs, the service does not"),
]


@pytest.mark.parametrize(
    ("wrapper", "reason"), DECLINED, ids=["mount-ns", "pid-ns", "user-ns", "capability", "nnp"]
)
def test_a_caller_in_another_context_is_declined(
    node: FakeNode,
    containers: Containers,
    tmp_path: Path,
    runtime_service: Start,
    wrapper: list[str],
    reason: str,
) -> None:
    """The dispatcher then runs Python in its own context; the service touched nothing (the
    runtime is a recorder: a service that took the create would have the caller exec it)."""
    env, _ = recorder_env(node, tmp_path / "cfg")
    svc = runtime_service(env)
    bundle = containers.bundle(env=["NVIDIA_VISIBLE_DEVICES=0"])
    before = (bundle / "config.json").read_text()
    reply_file = tmp_path / "reply"
    argv = [str(CLIENT), "--socket", str(svc.socket), "--reply-file", str(reply_file), "--"]
    argv += ["gpuhook-runtime", "create", "--bundle", str(bundle), "c1"]
    out = subprocess.run(
        [*wrapper, sys.executable, *argv],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == DECLINED_EXIT, out.stderr
    assert reason in out.stderr
    assert reply_file.read_bytes().startswith(wire.DECLINE)
    assert (bundle / "config.json").read_text() == before
    assert not (bundle / writer.RECORD_NAME).exists()


def _top_folders(*paths: object) -> list[str]:
    """The top-level folders a chrooted caller needs to see: the system's own, and the one
    each absolute path named here lies in (the checkout may be anywhere: /work, /check, ...)."""
    names = {"usr", "etc", "tmp", "proc", "dev", "bin", "lib", "lib64", "sbin"}
    names |= {Path(str(p)).parts[1] for p in paths if str(p).startswith("/") and str(p) != "/"}
    return sorted(n for n in names if os.path.lexists(f"/{n}"))


def test_a_caller_with_another_root_is_declined(
    node: FakeNode, containers: Containers, tmp_path: Path, runtime_service: Start
) -> None:
    """A caller chrooted into a folder that shows the same /usr, /tmp and the checkout's top
    folder (so it can run the client and name the same bundle) is still declined: its root is
    not the service's."""
    env, _ = recorder_env(node, tmp_path / "cfg")
    svc = runtime_service(env)
    bundle = containers.bundle(env=["NVIDIA_VISIBLE_DEVICES=0"])
    root = tmp_path / "root"
    mounted: list[Path] = []
    try:
        for name in _top_folders(sys.executable, CLIENT, bundle, tmp_path, *env.values()):
            if os.path.islink(f"/{name}"):
                (root / name).parent.mkdir(parents=True, exist_ok=True)
                (root / name).symlink_to(os.readlink(f"/{name}"))
                continue
            (root / name).mkdir(parents=True)
            subprocess.run(["mount", "--bind", f"/{name}", str(root / name)], check=True)
            mounted.append(root / name)
        argv = [str(CLIENT), "--socket", str(svc.socket), "--"]
        argv += ["gpuhook-runtime", "create", "--bundle", str(bundle), "c1"]
        out = subprocess.run(
            ["chroot", str(root), sys.executable, *argv],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        for path in reversed(mounted):
            subprocess.run(["umount", "-l", str(path)], check=False)
    assert out.returncode == DECLINED_EXIT, out.stderr
    assert "has another root folder" in out.stderr
    assert not (bundle / writer.RECORD_NAME).exists()


def test_a_caller_of_another_user_is_declined(
    node: FakeNode, containers: Containers, tmp_path: Path, runtime_service: Start
) -> None:
    """Even where the socket lets it connect (mode 0666 here, 0600 as the service makes it)."""
    env, _ = recorder_env(node, tmp_path / "cfg")
    folder = Path(tempfile.mkdtemp(prefix="gh-svc-"))
    folder.chmod(0o755)
    try:
        svc = runtime_service(env, folder / "run" / "runtime.sock")
        assert (folder / "run").stat().st_mode & 0o777 == 0o755  # made by the service
        assert svc.socket.stat().st_mode & 0o777 == 0o600
        svc.socket.chmod(0o666)
        bundle = containers.bundle(env=["NVIDIA_VISIBLE_DEVICES=0"])
        before = (bundle / "config.json").read_text()
        argv = ["gpuhook-runtime", "create", "--bundle", str(bundle), "c1"]
        out = subprocess.run(
            [sys.executable, str(CLIENT), "--socket", str(svc.socket), "--", *argv],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            check=False,
            user=65534,
            cwd="/",
        )
        assert out.returncode == DECLINED_EXIT, out.stderr
        assert "declined: the caller runs as uid 65534, the runtime service as uid 0" in out.stderr
        assert (bundle / "config.json").read_text() == before
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# --- the service itself ---------------------------------------------------------------------------


def raw_reply(path: Path, data: bytes, fds: list[int], sndbuf: int = 0) -> bytes:
    """Send one message with ``fds`` as the dispatcher would, however wrong; the reply."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
        if sndbuf:
            sock.setsockopt(socket.SOL_SOCKET, 32, sndbuf)  # SO_SNDBUFFORCE (root)
        sock.settimeout(60)
        sock.connect(str(path))
        socket.send_fds(sock, [data], fds)
        return sock.recv(wire.MAX_REPLY)


def test_a_malformed_message_is_declined_with_its_reason(
    node: FakeNode, tmp_path: Path, runtime_service: Start
) -> None:
    """What the socket carries, checked before anything else: the descriptors, the size, the
    format (each format error: tests/unit/test_runtime_service.py)."""
    svc = runtime_service(node.env)
    good = wire.encode_request(["gpuhook-runtime", "list"], ["PATH=/bin"])
    null = os.open(os.devnull, os.O_RDWR)
    folder = os.open("/", os.O_PATH | os.O_DIRECTORY)
    try:
        cases = [
            (good, [null, null, null], b"3 descriptors passed, not 4"),
            (good, [null, null, null, folder, null], b"4 or more descriptors passed, not 4"),
            (good, [], b"0 descriptors passed, not 4"),
            (good, [null, null, null, null], b"the fourth descriptor is not a folder"),
            (b"junk", [null, null, null, folder], b"not a gpuhook-runtime/1 request"),
        ]
        for data, fds, reason in cases:
            assert raw_reply(svc.socket, data, fds) == wire.DECLINE + reason
        big = wire.encode_request(["gpuhook-runtime", "x" * wire.MAX_REQUEST], [])
        reply = raw_reply(svc.socket, big, [null, null, null, folder], sndbuf=4 << 20)
        assert reply == wire.DECLINE + f"request over {wire.MAX_REQUEST} bytes".encode()
    finally:
        os.close(null)
        os.close(folder)
    assert service.probe(str(svc.socket)) == ""  # still serving


def children_of(pid: int) -> dict[int, str]:
    """``pid``'s child processes: each one's pid and state (Z: a zombie nobody reaped)."""
    children = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()
        except (OSError, ValueError):
            continue
        if int(fields[1]) == pid:
            children[int(entry)] = fields[0]
    return children


def test_many_creates_at_once_are_all_answered(
    node: FakeNode, containers: Containers, tmp_path: Path, runtime_service: Start
) -> None:
    fake, _ = recorder(tmp_path / "cfg")
    svc = runtime_service(node.variant(tmp_path / "cfg", runtime={"path": str(fake)}))
    jobs = [(i, containers.bundle(env=[f"NVIDIA_VISIBLE_DEVICES={i % 6}"])) for i in range(24)]
    replies: dict[int, Any] = {}

    def one(i: int, bundle: Path) -> None:
        replies[i] = request(
            svc.socket, ["gpuhook-runtime", "create", "--bundle", str(bundle), f"many-{i}"], svc.env
        )

    threads = [threading.Thread(target=one, args=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(replies) == list(range(24))
    for i, bundle in jobs:
        assert replies[i].raw == wire.EXEC + str(fake).encode()
        spec = json.loads((bundle / "config.json").read_text())
        paths = {d["path"] for d in spec["linux"]["devices"]}
        assert (
            f"/dev/nvidia{i % 6}" in paths
            and len(paths & {f"/dev/nvidia{g}" for g in range(8)}) == 1
        )
        assert json.loads((bundle / writer.RECORD_NAME).read_text())["container_id"] == f"many-{i}"
    idle = ["S"] * POOL
    for _ in range(100):  # the workers exit once they replied (none is left a zombie); the
        if list(children_of(svc.process.pid).values()) == idle:  # idle pool waits for more
            break
        time.sleep(0.05)
    assert list(children_of(svc.process.pid).values()) == idle
    pool = list(children_of(svc.process.pid))
    svc.stop()
    for _ in range(100):  # stopping the service ends its idle workers
        if not any(os.path.exists(f"/proc/{pid}") for pid in pool):
            break
        time.sleep(0.05)
    assert not any(os.path.exists(f"/proc/{pid}") for pid in pool)


def private_dirty_kib(pid: int) -> int:
    """The memory ``pid`` holds as its own copy (written since it was forked), in KiB."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Private_Dirty:"):
            return int(line.split()[1])
    raise AssertionError(f"no Private_Dirty in /proc/{pid}/smaps_rollup")


def test_new_workers_copy_the_pages_earlier_workers_wrote(
    node: FakeNode, containers: Containers, tmp_path: Path, runtime_service: Start
) -> None:
    """Before any call, an idle worker holds almost nothing of its own; once workers that
    decided creates have reported the service's pages they wrote, the workers forked after copy
    those pages while they wait (runtime/prefault.py), so a call finds them already copied."""
    if prefault.populate_write() is None:
        pytest.skip("this kernel has no MADV_POPULATE_WRITE: workers copy nothing ahead")
    fake, _ = recorder(tmp_path / "cfg")
    svc = runtime_service(node.variant(tmp_path / "cfg", runtime={"path": str(fake)}))
    first = children_of(svc.process.pid)
    before = max(private_dirty_kib(pid) for pid in first)
    for i in range(3):
        bundle = containers.bundle(env=[f"NVIDIA_VISIBLE_DEVICES={i}"])
        argv = ["gpuhook-runtime", "create", "--bundle", str(bundle), f"copied-{i}"]
        assert request(svc.socket, argv, svc.env).kind == wire.EXEC
    copied = 0
    for _ in range(200):  # the newest workers copy once forked, before they wait in accept
        later = [pid for pid in children_of(svc.process.pid) if pid not in first]
        copied = max((private_dirty_kib(pid) for pid in later), default=0)
        if copied >= before + 1024:
            break
        time.sleep(0.05)
    assert copied >= before + 1024, (before, copied)


def test_sigterm_removes_the_socket_and_start_stop_are_logged(
    node: FakeNode,
    containers: Containers,
    tmp_path: Path,
    socket_folder: Path,
    runtime_service: Start,
) -> None:
    """And a create whose connection the service took before SIGTERM is still answered (its
    child is not the service: systemd's KillMode=process leaves it running)."""
    import socket

    log = tmp_path / "service.log"
    path = socket_folder / "run" / "runtime.sock"
    env = node.variant(
        tmp_path / "cfg", runtime={"service": str(path)}, log={"level": "info", "file": str(log)}
    )
    svc = runtime_service(env, path, from_config=True)  # no --socket: runtime.service
    assert svc.wait_listening() == (
        f"gpuhook runtime service: listening on {path} (pid {svc.process.pid})\n"
    )
    assert path.is_socket() and path.stat().st_mode & 0o777 == 0o600
    assert service.probe(str(path)) == ""  # a probe is not answered, and harms nothing
    assert doctor_line(node, env) == {"status": "pass", "message": f"listening at {path}"}
    taken = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    taken.connect(str(path))
    # a worker took it and waits for the request; the service forked another in its place
    took = POOL + 1
    for _ in range(200):
        if len(children_of(svc.process.pid)) == took:
            break
        time.sleep(0.05)
    assert len(children_of(svc.process.pid)) == took
    assert svc.stop() == 0
    assert not path.exists()
    bundle = containers.bundle(env=["NVIDIA_VISIBLE_DEVICES=3"])
    argv = ["gpuhook-runtime", "create", "--bundle", str(bundle), "late"]
    message = wire.encode_request(argv, [f"{k}={v}" for k, v in env.items()])
    folder = os.open("/", os.O_PATH | os.O_DIRECTORY)
    null = os.open(os.devnull, os.O_RDWR)
    with taken:
        socket.send_fds(taken, [message], [null, null, null, folder])
        reply = taken.recv(wire.MAX_REPLY)
    os.close(folder)
    os.close(null)
    assert reply.startswith(wire.EXEC)
    assert f"NVIDIA_VISIBLE_DEVICES={uuid(node, 3)}" in (bundle / "config.json").read_text()
    assert doctor_line(node, env) == {
        "status": "warn",
        "message": f"not running (no socket at {path}): creates with a GPU marker start "
        "Python: slower, still correct",
    }
    events = [json.loads(x) for x in log.read_text().splitlines()]
    started = [e for e in events if e["event"] == "runtime service started"]
    stopped = [e for e in events if e["event"] == "runtime service stopped"]
    assert [e["socket"] for e in started] == [str(svc.socket)]
    assert [(e["socket"], e["signal"]) for e in stopped] == [(str(svc.socket), "SIGTERM")]


def doctor_line(node: FakeNode, env: dict[str, str]) -> dict[str, str]:
    out = node.gpuhook("doctor", "-o", "json", env=env)
    [check] = [c for c in json.loads(out.stdout)["checks"] if c["check"] == "runtime service"]
    return {"status": check["status"], "message": check["message"]}


def test_the_service_runs_in_a_process_of_its_own_without_the_cli(
    node: FakeNode, runtime_service: Start
) -> None:
    """``gpuhook runtime serve`` execs the service's own interpreter (same pid, so systemd's
    unit and the listening line still name it): its workers are forked from a process that maps
    nothing from site-packages (click, yaml and jsonschema are the CLI's, and a fork copies the
    page tables of all it holds)."""
    svc = runtime_service(node.env)
    pid = svc.process.pid
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
    assert argv[1:3] == [b"-I", b"-S"] and argv[3].endswith(b"/gpuhook/_service_entry.py")
    assert argv[5] == str(svc.socket).encode()
    mapped = {line.split()[-1] for line in Path(f"/proc/{pid}/maps").read_text().splitlines()}
    assert [m for m in mapped if "-packages/" in m] == []
    assert service.probe(str(svc.socket)) == ""


def test_start_replaces_a_dead_services_socket_and_refuses_a_live_one(
    node: FakeNode, tmp_path: Path, socket_folder: Path, runtime_service: Start
) -> None:
    import socket

    path = socket_folder / "run" / "runtime.sock"
    path.parent.mkdir()
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as dead:
        dead.bind(str(path))  # bound, never listening: what a killed service leaves
    svc = runtime_service(node.env, path)
    second = RuntimeService(path, node.env, tmp_path / "second")
    assert second.process.wait(60) == 1
    assert second.stderr.read_text() == f"gpuhook: another runtime service is listening on {path}\n"
    assert service.probe(str(path)) == ""  # the first one still serves
    svc.stop()


# --- what a request imports -----------------------------------------------------------------------


def test_the_service_has_imported_what_the_shim_process_imports(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    """Run as a process (-X importtime), the shim's create paths import only modules the service
    imported before it forks: a request imports nothing."""
    preloaded = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            f"import sys; sys.path.insert(0, {str(REPO / 'src')!r});"
            "from gpuhook.runtime import service; service.preload(); print(*sys.modules)",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    env, _ = recorder_env(node, tmp_path, log=OPERATOR_LOG)
    create_with_importtime(env, containers.bundle(), "warm")
    k8s, _ = recorder_env(
        node, tmp_path / "k8s", log=OPERATOR_LOG, policy=leak_policy(node, tmp_path / "cp")
    )
    create_with_importtime(k8s, containers.bundle(), "warm-k8s")  # its config compiled once
    cases = {
        "leak": (k8s, CASES["leak"]),
        "gpu1": (env, CASES["gpu1"]),
        "mig": (env, {"env": ["NVIDIA_VISIBLE_DEVICES=7:1"]}),
        "no marker": (env, {}),
    }
    for name, (case_env, kw) in cases.items():
        modules, _ = create_with_importtime(
            case_env, containers.bundle(**kw), name.replace(" ", "-")
        )
        assert modules - set(preloaded) == set(), name


# --- the compiled dispatcher with the service ------------------------------------------------


def relocated_dispatcher(folder: Path, command: list[str]) -> Path:
    """build/bin/gpuhook-runtime with ``command`` as its interpreter command."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "gpuhook-runtime"
    path.write_bytes(dispatch.relocate((REPO / "build/bin/gpuhook-runtime").read_bytes(), command))
    path.chmod(0o755)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("case", ["leak", "gpu1"])
def test_the_dispatcher_hands_gpu_creates_to_the_service_and_starts_no_interpreter(
    node: FakeNode,
    containers: Containers,
    tmp_path: Path,
    socket_folder: Path,
    runtime_service: Start,
    case: str,
) -> None:
    """The real dispatcher, whose interpreter command names a file that does not exist (any
    Python start would fail the create with "cannot execute"), with the service on the config's
    socket: the GPU create is decided by the service and the container sees its grant; a
    container without a marker is passed to runc. With the service stopped, the same create needs
    the interpreter (and fails here); a dispatcher with a real one decides it without a service."""
    sock = socket_folder / "svc" / "runtime.sock"
    env = case_env(node, tmp_path / "cfg", case, runtime={"service": str(sock)})
    config_loading.load(env["GPUHOOK_CONFIG"])  # the cache and pointer, as any gpuhook call writes
    svc = runtime_service(env, socket=sock)
    missing = tmp_path / "no-python"
    runtime = str(relocated_dispatcher(tmp_path / "none", [str(missing)]))
    seen = containers.probe(env, runtime=runtime, **CASES[case])
    assert seen["returncode"] == 0, seen["stderr"]
    if case == "leak":
        assert (seen["dev"], seen["env"]["NVIDIA_VISIBLE_DEVICES"]) == ([], "void")
    else:
        assert (seen["dev"], seen["env"]["NVIDIA_VISIBLE_DEVICES"]) == (gpus(1), uuid(node, 1))
        assert seen["smi"][-1] == "rc=0"
    record = json.loads((seen["bundle"] / writer.RECORD_NAME).read_text())
    assert record["container_id"] == seen["container_id"]
    plain = containers.probe(env, runtime=runtime)
    assert (plain["returncode"], plain["dev"]) == (0, [])
    assert not (plain["bundle"] / writer.RECORD_NAME).exists()
    svc.stop()
    failed = containers.probe(env, runtime=runtime, **CASES[case])
    assert failed["returncode"] != 0
    assert f"gpuhook: cannot execute {missing}: No such file or directory" in failed["stderr"]
    python = dispatch.python_command(sys.executable, str(REPO / "src"))
    fallback = containers.probe(env, runtime=str(relocated_dispatcher(tmp_path / "py", python)),
                                **CASES[case])  # fmt: skip
    assert fallback["returncode"] == 0, fallback["stderr"]
    assert fallback["dev"] == seen["dev"]
