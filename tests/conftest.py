"""Shared fixtures: a fake GPU node (tools/fake-node), a minimal glibc rootfs, and helpers to
run the gpuhook CLI and real containers through gpuhook-runtime."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))

import testbed  # noqa: E402

FAKE_NODE = REPO / "tools" / "fake-node"

# root/slow tests skip when not root, except in CI, where any skip fails the run
pytest_plugins = ["tests.required", "tests.hostguard"]


def mps_daemons_under(root: Path) -> list[int]:
    """Live nvidia-cuda-mps-control processes whose pipe directory is under ``root`` (the ones a
    test started: other tests' daemons and a real node's are left alone)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if os.path.basename(cmdline[0]) != b"nvidia-cuda-mps-control":
            continue
        pipe = [e for e in environ if e.startswith(b"CUDA_MPS_PIPE_DIRECTORY=")]
        if pipe and pipe[0].split(b"=", 1)[1].decode().startswith(str(root)):
            found.append(int(entry))
    return found


class FakeNode:
    """A fake GPU node made by tools/fake-node, with gpuhook's config pointing at it."""

    def __init__(self, root: Path, truth: dict[str, Any], env: dict[str, str]) -> None:
        self.root = root
        self.truth = truth
        self.env = env
        self.config = Path(env["GPUHOOK_CONFIG"])

    def gpuhook(
        self,
        *args: str,
        env: Mapping[str, str] | None = None,
        check: bool = False,
        stdin: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        full = {**os.environ, **self.env, **(env or {})}
        return subprocess.run(
            [testbed.GPUHOOK, *args],
            capture_output=True,
            text=True,
            env=full,
            check=check,
            input=stdin,
            timeout=120,
        )

    def refresh(self) -> None:
        out = self.gpuhook("inventory", "refresh")
        assert out.returncode == 0, out.stderr

    def variant(self, folder: Path, **sections: Any) -> dict[str, str]:
        """The env of a copy of this node's config with some keys changed (same state_dir and
        inventory), for tests that need another policy without touching the shared node."""
        import yaml

        data = yaml.safe_load(self.config.read_text()) or {}
        _deep_update(data, sections)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"config-{uuid.uuid4().hex[:8]}.yaml"
        path.write_text(yaml.safe_dump(data))
        return {**self.env, "GPUHOOK_CONFIG": str(path)}

    def set_config(self, **sections: Any) -> None:
        """Merge keys into the node's config.yaml (nested dicts merge)."""
        import yaml

        data = yaml.safe_load(self.config.read_text()) or {}
        _deep_update(data, sections)
        self.config.write_text(yaml.safe_dump(data))


# a stand-in for runc: records its argv, one argument a line, and exits 42
RECORDER = """#!/bin/sh
printf '%s\\n' "$@" > "{out}"
exit 42
"""


def recorder(folder: Path) -> tuple[Path, Path]:
    """:data:`RECORDER` as ``folder``/fake-runc; (its path, the file it writes its argv to)."""
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "argv.txt"
    fake = folder / "fake-runc"
    fake.write_text(RECORDER.format(out=out))
    fake.chmod(0o755)
    return fake, out


def recorder_env(node: FakeNode, folder: Path, **sections: Any) -> tuple[dict[str, str], Path]:
    """The env of a config of ``node`` (in ``folder``, with ``sections``) whose runtime is a
    :func:`recorder`; (that env, the file the recorder writes its argv to)."""
    fake, out = recorder(folder)
    return node.variant(folder, runtime={"path": str(fake)}, **sections), out


def _deep_update(into: dict[str, Any], new: Mapping[str, Any]) -> None:
    for key, value in new.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _deep_update(into[key], value)
        else:
            into[key] = value


def make_fake_node(path: Path, *args: str) -> FakeNode:
    out = subprocess.run(
        [
            sys.executable,
            str(FAKE_NODE),
            str(path),
            "--force",
            "--hook-path",
            testbed.GPUHOOK,
            *args,
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    env: dict[str, str] = {}
    for line in out.stdout.splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export ") :].partition("=")
            env[key] = value.strip("'\"")
    # one config cache folder for every gpuhook the session starts (tests/hostguard.py), so that
    # a test computing a cache path in this process finds what its subprocesses wrote
    env["GPUHOOK_CACHE_DIR"] = os.environ["GPUHOOK_CACHE_DIR"]
    truth = json.loads((path / "node.json").read_text())
    return FakeNode(path, truth, env)


@pytest.fixture(scope="session")
def fake_node_factory(tmp_path_factory: pytest.TempPathFactory) -> Any:
    def factory(*args: str) -> FakeNode:
        return make_fake_node(tmp_path_factory.mktemp("node"), *args)

    return factory


@pytest.fixture(scope="session")
def node(fake_node_factory: Any) -> FakeNode:
    """The standard node: 8 GPUs, GPUs 6 and 7 MIG-enabled with 3 MIG devices each.
    Session-wide: tests must not change it (use fake_node_factory for a private one)."""
    n: FakeNode = fake_node_factory("--gpus", "8", "--mig-gpus", "6,7", "--mig-devices", "3")
    n.refresh()
    return n


@pytest.fixture(scope="session")
def rootfs_template(tmp_path_factory: pytest.TempPathFactory) -> str:
    return testbed.build_rootfs(str(tmp_path_factory.mktemp("rootfs") / "rootfs"))


@pytest.fixture(scope="session")
def spec_template(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return testbed.base_spec(str(tmp_path_factory.mktemp("spec")))


class Containers:
    """Make bundles and run them through gpuhook-runtime with a private runc state root."""

    def __init__(self, base: Path, rootfs: str, spec: dict[str, Any]) -> None:
        self.base = base
        self.rootfs = rootfs
        self.spec = spec
        self.state = base / "runc-state"
        self.state.mkdir(parents=True, exist_ok=True)

    def bundle(self, name: str | None = None, **kw: Any) -> Path:
        path = self.base / (name or f"b-{uuid.uuid4().hex[:8]}")
        testbed.make_bundle(str(path), self.rootfs, spec_template=self.spec, **kw)
        return path

    def run(
        self,
        bundle: Path,
        env: Mapping[str, str],
        runtime: str = testbed.RUNTIME,
        container_id: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        cid = container_id or f"gh-{uuid.uuid4().hex[:12]}"
        return testbed.run_container(str(bundle), cid, str(self.state), env, runtime)

    def create(
        self,
        bundle: Path,
        env: Mapping[str, str],
        container_id: str | None = None,
        runtime: str = testbed.RUNTIME,
    ) -> tuple[str, int, str]:
        """``<runtime> --root STATE create``: the container waits in state ``created`` (start
        it with :meth:`runc`). Its init keeps the caller's stdio, so they are files, not pipes.
        Returns (id, exit code, stderr)."""
        cid = container_id or f"gh-{uuid.uuid4().hex[:12]}"
        out, err = self.base / f"{cid}.out", self.base / f"{cid}.err"
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            code = subprocess.run(
                [runtime, "--root", str(self.state), "create", "--bundle", str(bundle), cid],
                env={"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), **env},
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                timeout=60,
                check=False,
            ).returncode
        return cid, code, err.read_text()

    def runc(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Plain runc on this state root (start, state, delete, ...), as the engine calls it."""
        return subprocess.run(
            ["runc", "--root", str(self.state), *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def status(self, container_id: str) -> str:
        """The runtime's status of a container ("" when it does not know it)."""
        out = self.runc("state", container_id)
        return str(json.loads(out.stdout)["status"]) if out.returncode == 0 else ""

    def probe(
        self,
        runtime_env: Mapping[str, str],
        container_id: str | None = None,
        runtime: str = testbed.RUNTIME,
        **kw: Any,
    ) -> dict[str, Any]:
        """Run the standard probe in a container (``kw`` shapes the bundle: env, annotations,
        mounts, privileged, hooks); return what it saw (dev nodes, env, ldconfig -p,
        nvidia-smi -L) plus the runtime's exit code, stderr, the bundle path and the id."""
        bundle = self.bundle(args=("/bin/sh", "-c", testbed.PROBE), **kw)
        cid = container_id or f"gh-{uuid.uuid4().hex[:12]}"
        out = self.run(bundle, runtime_env, runtime=runtime, container_id=cid)
        seen = testbed.parse_probe(out.stdout)
        seen.update(returncode=out.returncode, stderr=out.stderr, bundle=bundle, container_id=cid)
        return seen


@pytest.fixture
def containers(
    tmp_path: Path, rootfs_template: str, spec_template: dict[str, Any]
) -> Iterator[Containers]:
    c = Containers(tmp_path, rootfs_template, spec_template)
    yield c
    subprocess.run(
        f"for c in $(runc --root {c.state} list -q); do runc --root {c.state} delete -f $c; done",
        shell=True,
        capture_output=True,
        check=False,
    )


@pytest.fixture
def socket_folder() -> Iterator[Path]:
    """A fresh folder with a short path, for unix sockets (at most 107 bytes: tmp_path may be
    longer), removed at the end of the test."""
    import shutil

    from tests.integration import engines

    folder = engines.short_dir("gh-sock-")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def runtime_service(tmp_path: Path, socket_folder: Path) -> Iterator[Callable[..., Any]]:
    """Start ``gpuhook runtime serve`` (the executable under test): ``start(env, socket=None)``
    runs it with ``env`` over this process's environment (GPUHOOK_CONFIG: the test's config;
    ``--socket`` a fresh folder under ``socket_folder``, or ``socket``; ``from_config``: no
    ``--socket``, runtime.service is ``socket``), waits until it listens and returns a
    :class:`tests.runtime_service.RuntimeService` (its output under tmp_path). Every one started
    is stopped with SIGTERM at the end of the test."""
    from tests.runtime_service import RuntimeService

    services: list[RuntimeService] = []

    def start(
        env: Mapping[str, str], socket: Path | None = None, *, from_config: bool = False
    ) -> RuntimeService:
        n = len(services)
        path = socket or socket_folder / f"service{n}" / "runtime.sock"
        svc = RuntimeService(path, env, tmp_path / f"service{n}", socket_option=not from_config)
        services.append(svc)
        svc.wait_listening()
        return svc

    yield start
    for svc in services:
        svc.stop()


def systemd_verify(unit: Path, *expected: str) -> list[str]:
    """What ``systemd-analyze verify`` says about ``unit`` (an instance name of a template is
    fine), but the complaints a dev machine always has: /usr/bin/gpuhook not installed, and the
    lines naming the man pages in ``expected``."""
    out = subprocess.run(
        ["systemd-analyze", "verify", str(unit)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    return [
        line
        for line in (out.stdout + out.stderr).splitlines()
        if line.strip()
        and "/usr/bin/gpuhook is not executable" not in line
        and not any(f"man {page}" in line for page in expected)
    ]
