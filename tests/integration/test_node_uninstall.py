"""``gpuhook node uninstall`` on a node where containers created through gpuhook still run: their
runc shims call /opt/gpuhook/bin/gpuhook-runtime for kill, delete and exec, so that path stays,
replaced in place by a pass-through to the low-level runtime; everything else goes."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from gpuhook.node import install

TASKS = "run/containerd/io.containerd.runtime.v2.task/k8s.io"


def node(tmp_path: Path) -> Path:
    root = tmp_path / "host"
    for rel, text in {
        "opt/gpuhook/bin/gpuhook-runtime": "#!/bin/sh\n",
        "opt/gpuhook/lib/python3/dist-packages/gpuhook/__init__.py": "",
        "etc/gpuhook/config.yaml": "runtime:\n  path: /usr/sbin/runc\n",
        f"{TASKS}/through-gpuhook/options.json": json.dumps(
            {"binary_name": install.RUNTIME_PATH, "systemd_cgroup": True}
        ),
        f"{TASKS}/through-runc/options.json": json.dumps({"binary_name": "/usr/sbin/runc"}),
        f"{TASKS}/no-options/config.json": "{}",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    created = ("/etc/gpuhook", "/etc/gpuhook/config.yaml", "/var/lib/gpuhook")
    install.write_record(str(root), install.Record("containerd", created, False))
    return root


def files(root: Path) -> list[str]:
    return sorted(
        os.path.relpath(os.path.join(d, n), root) for d, _, names in os.walk(root) for n in names
    )


def test_live_containers_keep_a_pass_through_runtime(tmp_path: Path) -> None:
    root = node(tmp_path)
    lines = install.uninstall(str(root), restart=False)
    assert "removed /opt/gpuhook, all but /opt/gpuhook/bin/gpuhook-runtime" in lines
    assert (
        "kept /opt/gpuhook/bin/gpuhook-runtime as a pass-through to /usr/sbin/runc: 1 containers "
        "created through gpuhook still call it (e.g. through-gpuhook); remove /opt/gpuhook once "
        "they are gone"
    ) in lines
    assert "removed /etc/gpuhook" in lines
    assert [f for f in files(root) if not f.startswith("run/")] == [
        "opt/gpuhook/bin/gpuhook-runtime"
    ]
    stub = root / "opt/gpuhook/bin/gpuhook-runtime"
    assert stub.stat().st_mode & 0o777 == 0o755
    assert 'exec /usr/sbin/runc "$@"' in stub.read_text()
    assert os.access("/usr/sbin/runc", os.X_OK), "runc is installed by scripts/bootstrap"
    out = subprocess.run(
        ["sh", str(stub), "--version"], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0 and out.stdout.startswith("runc version")


def test_without_live_containers_nothing_is_kept(tmp_path: Path) -> None:
    root = node(tmp_path)
    (root / TASKS / "through-gpuhook/options.json").unlink()
    lines = install.uninstall(str(root), restart=False)
    assert "removed /opt/gpuhook" in lines
    assert [f for f in files(root) if not f.startswith("run/")] == []
    assert install.uninstall(str(root), restart=False) == [
        "/opt/gpuhook/install.json: not found; gpuhook was not installed here by "
        "`gpuhook node install`"
    ]


def test_a_restart_owed_by_a_failed_uninstall_is_done_by_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine was unregistered but its restart failed: the engine still runs gpuhook from
    memory, so the next uninstall restarts it before removing /opt/gpuhook."""
    from gpuhook.node import host

    root = node(tmp_path)
    record = install.read_record(str(root))
    assert record is not None
    install.write_record(str(root), record.with_pending(True))
    restarted: list[str] = []

    def restart(engine: str) -> str:
        restarted.append(engine)
        return "restarted"

    monkeypatch.setattr(host, "restart", restart)
    lines = install.uninstall(str(root), restart=True)
    assert restarted == ["containerd"]
    assert lines.index("restarted") < lines.index("removed /etc/gpuhook")


@pytest.mark.root
def test_a_prepared_driver_folder_a_container_has_mounted_is_kept(tmp_path: Path) -> None:
    """A running container's library folder is a bind mount of a prepared driver folder under
    the state folder (gpuhook.runtime.prepared): it stays, as the driver's own files it showed
    before would have; a folder nobody holds goes with the rest."""
    root = node(tmp_path)
    (root / TASKS / "through-gpuhook/options.json").unlink()
    prepared = root / "var/lib/gpuhook/driverfiles"
    for generation in ("held", "free"):
        lib = prepared / generation / "compute+utility/lib"
        lib.mkdir(parents=True)
        (lib / "libcuda.so.1").write_text("driver")
    target = tmp_path / "container-lib"
    target.mkdir()
    holder = subprocess.Popen(  # a container: its own mount namespace holding the bind mount
        ["unshare", "-m", "--propagation", "private", "sh", "-c",
         f"mount --bind {prepared}/held/compute+utility/lib {target} && echo up && sleep 60"],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "up\n"
        lines = install.uninstall(str(root), restart=False)
    finally:
        holder.kill()
        holder.wait()
    held = "/var/lib/gpuhook/driverfiles/held"
    assert f"removed /var/lib/gpuhook, all but {held}" in lines
    assert [f for f in files(root) if not f.startswith("run/")] == [
        "var/lib/gpuhook/driverfiles/held/compute+utility/lib/libcuda.so.1"
    ]
