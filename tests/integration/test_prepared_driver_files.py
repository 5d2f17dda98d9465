"""The driver's library folders prepared on the host (gpuhook.inventory.prepared), through
gpuhook-runtime and real runc on a private fake node: a container sees exactly what the tmpfs and
per-file bind mounts gave it (the same files, sonames, links, ``ldconfig -p`` entries, libraries
loaded by soname, read-only files) from ONE read-only bind mount per library folder; and a driver
change gives new creates the new files while a running container keeps the ones it started with.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests import driverimages
from tests.conftest import Containers, FakeNode

pytestmark = [pytest.mark.slow, pytest.mark.root]

LIB = "/usr/local/gpuhook/lib"
# What a program in the container sees of the library folders: every entry (type, mode, size of
# a file, a link's target), the checksums of the files, `ldconfig -p`, libraries loaded by
# soname, and whether a driver file can be written.
VIEW = (
    "for d in " + LIB + " " + LIB + "32; do [ -d $d ] || continue; cd $d; "
    "find . | sort | while read f; do "
    'if [ -L $f ]; then echo "$d/$f link $(readlink $f)"; '
    'elif [ -d $f ]; then echo "$d/$f dir $(stat -c %a $f)"; '
    "else echo \"$d/$f file $(stat -c '%a %s' $f) $(md5sum < $f | cut -c1-32)\"; fi; done; done; "
    "echo '--- ldconfig'; ldconfig -p | tail -n +2 | sort; "
    "echo '--- dlopen'; /loader libcuda.so.1; /loader libnvidia-ml.so.1; "
    "echo '--- write'; for f in " + LIB + "/libcuda.so.1 " + LIB + "/libnvidia-ml.so.1; do "
    'if (echo x >> $f) 2>/dev/null; then echo "writable $f"; else echo "read-only $f"; fi; done'
)


@pytest.fixture
def private_node(fake_node_factory: Any) -> FakeNode:
    n: FakeNode = fake_node_factory("--gpus", "2")
    n.refresh()
    return n


def loader_bundle(containers: Containers, loader: Path, script: str, *env: str) -> Path:
    bundle = containers.bundle(args=("/bin/sh", "-c", script), env=env)
    (bundle / "rootfs/loader").write_bytes(loader.read_bytes())
    (bundle / "rootfs/loader").chmod(0o755)
    return bundle


def view(containers: Containers, node: FakeNode, loader: Path, *env: str) -> tuple[str, Any]:
    """What the container sees, and the library mounts of the spec gpuhook wrote."""
    bundle = loader_bundle(containers, loader, VIEW, "NVIDIA_VISIBLE_DEVICES=0", *env)
    out = containers.run(bundle, node.env)
    assert out.returncode == 0, out.stderr
    spec = json.loads((bundle / "config.json").read_text())
    mounts = [m for m in spec["mounts"] if m["destination"].startswith(LIB)]
    return out.stdout, mounts


def without_prepared(node: FakeNode) -> None:
    """The inventory as the gpuhook before prepared folders wrote it (no ``prepared`` key)."""
    path = Path(node.truth["state_dir"]) / "inventory.json"
    data = json.loads(path.read_text())
    data.pop("prepared", None)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("caps", ["", "all"], ids=["default-caps", "all-caps"])
def test_a_prepared_folder_shows_the_container_what_per_file_mounts_showed(
    private_node: FakeNode, containers: Containers, tmp_path: Path, caps: str
) -> None:
    loader = driverimages.build_loader(tmp_path / "loader")
    env = (f"NVIDIA_DRIVER_CAPABILITIES={caps}",) if caps else ()
    prepared_seen, prepared_mounts = view(containers, private_node, loader, *env)
    without_prepared(private_node)
    before_seen, before_mounts = view(containers, private_node, loader, *env)

    assert prepared_seen == before_seen
    assert "libcuda.so.1 => " + LIB + "/libcuda.so.1" in prepared_seen  # dlopen by soname
    assert f"libcuda.so (libc6,x86-64) => {LIB}/libcuda.so" in prepared_seen  # the dev link
    assert f"read-only {LIB}/libcuda.so.1" in prepared_seen
    assert "writable" not in prepared_seen
    folders = {m["destination"] for m in before_mounts if m["type"] == "tmpfs"}
    assert LIB in folders
    assert {m["destination"] for m in prepared_mounts} == folders - {LIB + "/gbm"}  # one each
    for mount in prepared_mounts:
        assert mount["type"] == "bind" and {"ro", "nosuid", "nodev"} <= set(mount["options"])
        assert "/driverfiles/" in mount["source"]
    assert len(before_mounts) > 10  # the tmpfs and a bind per library and soname


def test_a_driver_change_gives_new_creates_the_new_files_and_running_ones_the_old(
    private_node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    node = private_node
    libcuda = next(
        lib["host_path"]
        for libs in node.truth["libraries"].values()
        for lib in libs
        if lib["soname"] == "libcuda.so.1"
    )
    old = digest(libcuda)
    bundle = containers.bundle(args=("/bin/sleep", "60"), env=["NVIDIA_VISIBLE_DEVICES=0"])
    running, code, err = containers.create(bundle, node.env)
    assert code == 0, err
    assert containers.runc("start", running).returncode == 0
    first = prepared_generations(node)

    upgrade(libcuda)  # a package manager's way: a new file renamed over the old one
    node.refresh()
    new = digest(libcuda)
    assert new != old
    assert len(prepared_generations(node)) == 2 and first <= prepared_generations(node)

    script = f"md5sum < {LIB}/libcuda.so.1"
    gpu0 = ["NVIDIA_VISIBLE_DEVICES=0"]
    fresh = containers.run(containers.bundle(args=("/bin/sh", "-c", script), env=gpu0), node.env)
    assert fresh.returncode == 0, fresh.stderr
    assert fresh.stdout.split()[0] == new
    kept = containers.runc("exec", running, "/bin/sh", "-c", script)
    assert kept.returncode == 0, kept.stderr
    assert kept.stdout.split()[0] == old  # the running container is untouched

    # Two more driver changes: the generation the running container holds is kept while it
    # runs; once it is gone, the next change removes it (the newest old one is kept spare).
    upgrade(libcuda)
    node.refresh()
    assert first <= prepared_generations(node)
    assert containers.runc("delete", "-f", running).returncode == 0
    upgrade(libcuda)
    node.refresh()
    assert not first & prepared_generations(node)
    assert len(prepared_generations(node)) == 2


def digest(path: str) -> str:
    return hashlib.md5(Path(path).read_bytes()).hexdigest()  # noqa: S324 - md5sum's, to compare


def upgrade(path: str) -> None:
    data = Path(path).read_bytes() + os.urandom(16)
    temp = Path(path + ".new")
    temp.write_bytes(data)
    temp.chmod(0o755)
    temp.rename(path)


def prepared_generations(node: FakeNode) -> set[str]:
    root = Path(node.truth["state_dir"]) / "driverfiles"
    return {p.name for p in root.iterdir() if not p.name.startswith(".")}
