"""Upgrading the Debian package under load fails no create (issue 36, item 7).

In a fresh Debian 12 root (tests/integration/test_deb.py's), ``apt-get install`` of this
checkout's .deb; the runtime service runs (as gpuhook-runtime.service starts it); a loop creates
GPU containers through /usr/bin/gpuhook-runtime on a fake node (tests/createloop.py, in the
root, with a stand-in runtime that exits 0), each followed by its delete; then ``apt-get
install`` of the next .deb the suite builds (the same tree, version 0.1.1), and the service is
restarted as systemd restarts it after an upgrade (SIGTERM to its main process,
``KillMode=process``; there is no systemd in the root). The loop goes on: no create failed, and
the node runs the new version. (The DaemonSet's rolling update needs a cluster: not here.)
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import make_fake_node
from tests.integration.test_deb import (
    ARCH,
    BUILD_ENV,
    SYSTEM_PATH,
    Built,
    Chroot,
    built,  # noqa: F401  (the fixture: this checkout's .debs)
    clean_copy,
    debian_root,
    sh,
)

pytestmark = [pytest.mark.slow, pytest.mark.root]

REPO = Path(__file__).resolve().parents[2]
NEXT = "0.1.1"


@pytest.fixture(scope="module")
def built_next(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The next .deb: this checkout with its version raised to NEXT (changelog, pyproject,
    gpuhook.__version__), ``make deb`` in a clean copy."""
    copy = clean_copy(tmp_path_factory.mktemp("clone-next"))
    changelog = copy / "packaging/deb/debian/changelog"
    entry = (
        f"gpuhook ({NEXT}) bookworm; urgency=medium\n\n  * The next version, for the upgrade "
        "test.\n\n -- gpuhook developers <gpuhook@example.org>  Sun, 22 Nov 2026 18:00:00 +0000"
        "\n\n"
    )
    changelog.write_text(entry + changelog.read_text())
    for name, old, new in (
        ("pyproject.toml", 'version = "0.1.0"', f'version = "{NEXT}"'),
        ("src/gpuhook/__init__.py", '__version__ = "0.1.0"', f'__version__ = "{NEXT}"'),
    ):
        path = copy / name
        assert old in path.read_text(), name
        path.write_text(path.read_text().replace(old, new))
    out = sh("make", "deb", cwd=copy, env={**BUILD_ENV, "HOME": str(copy)})
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    deb = copy / "dist" / f"gpuhook_{NEXT}_{ARCH}.deb"
    assert deb.exists(), sorted((copy / "dist").iterdir())
    return deb


class Service:
    """``gpuhook runtime serve`` in the root, the ``nth`` to log to ``log``; once it listens."""

    def __init__(self, chroot: Chroot, env: dict[str, str], log: Path, nth: int) -> None:
        with open(log, "ab") as out:
            self.process = subprocess.Popen(
                ["chroot", str(chroot.root), "gpuhook", "runtime", "serve"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
            )
        deadline = time.monotonic() + 60
        while log.read_text().count("listening on") < nth:
            assert self.process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        self.process.wait(60)


def count(folder: Path) -> int:
    try:
        return int((folder / "count").read_text())
    except (OSError, ValueError):
        return 0


def wait_count(folder: Path, loop: subprocess.Popen[bytes], target: int) -> None:
    deadline = time.monotonic() + 300
    while count(folder) < target:
        assert loop.poll() is None, "the create loop ended"
        assert time.monotonic() < deadline, f"{count(folder)} creates"
        time.sleep(0.1)


def test_apt_install_of_the_next_deb_under_a_create_loop_fails_no_create(
    built: Built,  # noqa: F811
    built_next: Path,
    tmp_path: Path,
) -> None:
    node = make_fake_node(tmp_path / "node", "--gpus", "2", "--hook-path", "/usr/bin/gpuhook")
    with debian_root(tmp_path / "root") as chroot:
        (chroot.root / "tmp/dist").mkdir()
        for deb in built.debs:
            shutil.copy(deb, chroot.root / "tmp/dist" / deb.name)
        shutil.copy(built_next, chroot.root / "tmp" / built_next.name)
        chroot.ok("sh", "-c", "cd /tmp && apt-get install -y -q ./dist/*.deb")
        inside = chroot.root / str(node.root).lstrip("/")
        inside.parent.mkdir(parents=True, exist_ok=True)
        assert sh("cp", "-a", str(node.root), str(inside)).returncode == 0
        run = chroot.root / "run"
        assert sh("mount", "-t", "tmpfs", "tmpfs", str(run)).returncode == 0
        services: list[Service] = []
        loop = None
        try:
            folder = chroot.root / "tmp/loop"
            folder.mkdir()
            runtime = folder / "ok-runtime"
            runtime.write_text("#!/bin/sh\nexit 0\n")
            runtime.chmod(0o755)
            config = inside / "upgrade.yaml"
            config.write_text(
                (inside / "config.yaml").read_text()
                + "\n# the upgrade test's: a stand-in runtime, the service's socket\n"
            )
            _set_runtime(config, "/tmp/loop/ok-runtime", "/run/gpuhook/runtime.sock")
            env = {
                "PATH": SYSTEM_PATH,
                "LC_ALL": "C.UTF-8",
                "GPUHOOK_CONFIG": str(node.root / "upgrade.yaml"),
                "GPUHOOK_CACHE_DIR": "/run/gpuhook/config",
                "LD_LIBRARY_PATH": node.env["LD_LIBRARY_PATH"],
            }
            chroot.ok("gpuhook", "inventory", "refresh", env=env)
            (folder / "env.json").write_text(json.dumps(env))
            shutil.copy(REPO / "tests" / "createloop.py", folder / "createloop.py")
            log = tmp_path / "service.log"
            services.append(Service(chroot, env, log, 1))
            loop = subprocess.Popen(
                ["chroot", str(chroot.root), "python3", "/tmp/loop/createloop.py",
                 "/usr/bin/gpuhook-runtime", "/tmp/loop/env.json", "/tmp/loop", "2"],
                env=env, stdin=subprocess.DEVNULL,
            )  # fmt: skip
            wait_count(folder, loop, 40)
            chroot.ok("apt-get", "install", "-y", "-q", f"/tmp/{built_next.name}")
            services[-1].stop()  # systemd's restart after the upgrade (KillMode=process)
            services.append(Service(chroot, env, log, 2))
            wait_count(folder, loop, count(folder) + 40)
            (folder / "stop").write_text("")
            loop.wait(300)
            result = json.loads((folder / "result.json").read_text())
            version = chroot.ok("gpuhook", "--version").stdout
        finally:
            if loop is not None and loop.poll() is None:
                (chroot.root / "tmp/loop/stop").write_text("")
                loop.wait(300)
            for service in services:
                service.stop()
            sh("umount", str(run))
    assert version == f"gpuhook {NEXT}\n"
    assert result["failures"] == []
    assert result["creates"] >= 80


def _set_runtime(config: Path, path: str, socket: str) -> None:
    import yaml

    data = yaml.safe_load(config.read_text())
    data["runtime"] = {"path": path, "service": socket}
    config.write_text(yaml.safe_dump(data))
    os.chmod(config, 0o644)
