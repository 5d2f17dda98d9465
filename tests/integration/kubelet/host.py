"""What a real kubelet changes on the host, and putting it back.

Observed with the kubelet of ../shared/k8s (standalone, ``--root-dir`` and ``--cert-dir`` in the
suite's folder, ``podLogsDir`` there too, ``makeIPTablesUtilChains: false``):

- sysctls it sets at start (``setupKernelTunables``): ``vm.overcommit_memory=1``,
  ``kernel.panic=10``, ``kernel.panic_on_oops=1`` (and ``vm.panic_on_oom``,
  ``kernel.keys.root_max*`` when they differ from its defaults);
- ``/var/lib/kubelet/device-plugins`` with its ``kubelet.sock`` and the device checkpoint
  (DevicePluginPath is hard-coded), and ``/var/log/containers`` with a link per container log;
- the ``kubepods`` cgroups under its ``cgroupRoot`` in every hierarchy, the unified one of this
  hybrid host included (the suite gives it a cgroup of its own, which must exist in each v1
  hierarchy before it starts);
- a bind mount of its root dir onto itself (made shared).

:func:`snapshot` records the host's side before the suite, :func:`restore` puts it back and
:func:`differences` is the check at the end.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
HOST_PATHS = (Path("/var/lib/kubelet"), Path("/var/log/containers"), Path("/var/log/pods"))
CGROUP_FS = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class HostState:
    """The sysctls and the kubelet's host folders (every path under them; None: absent)."""

    sysctls: tuple[tuple[str, str], ...]
    trees: tuple[tuple[str, tuple[str, ...] | None], ...]
    mounts: tuple[str, ...]


def _tree(path: Path) -> tuple[str, ...] | None:
    if not path.exists():
        return None
    found = []
    for folder, dirs, files in os.walk(path):
        found += [os.path.join(folder, name) for name in dirs + files]
    return tuple(sorted(found))


def snapshot() -> HostState:
    sysctls = tuple((k, (Path("/proc/sys") / k).read_text().strip()) for k in SYSCTLS)
    trees = tuple((str(p), _tree(p)) for p in HOST_PATHS)
    mounts = tuple(sorted(m for p in HOST_PATHS for m in mounts_under(p)))
    return HostState(sysctls, trees, mounts)


def cgroup_hierarchies(types: tuple[str, ...] = ("cgroup", "cgroup2")) -> list[Path]:
    """The mounted cgroup hierarchies: v1 ones (the kubelet needs its cgroupRoot in each) and
    the unified one of a hybrid host (where the kubelet makes its kubepods too)."""
    out = []
    with open("/proc/self/mounts") as fh:
        for line in fh:
            fields = line.split()
            if fields[2] in types and fields[1].startswith(f"{CGROUP_FS}/"):
                out.append(Path(fields[1]))
    return out


def make_cgroup(name: str) -> None:
    """``/<name>`` in every v1 hierarchy (cpuset's with its parent's cpus and mems)."""
    for hierarchy in cgroup_hierarchies(("cgroup",)):
        folder = hierarchy / name
        folder.mkdir()
        for key in ("cpuset.cpus", "cpuset.mems"):
            if (hierarchy / key).exists():
                (folder / key).write_text((hierarchy / key).read_text())


def cgroups_left(name: str) -> list[str]:
    return [str(h / name) for h in cgroup_hierarchies() if (h / name).exists()]


def remove_cgroup(name: str) -> None:
    """``/<name>`` and every cgroup under it, deepest first (their tasks are gone by now)."""
    for hierarchy in cgroup_hierarchies():
        top = hierarchy / name
        if not top.is_dir():
            continue
        folders = [Path(f) for f, _, _ in os.walk(top)]
        for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
            try:
                folder.rmdir()
            except OSError:
                pass


def mounts_under(path: Path) -> list[str]:
    prefix = str(path).rstrip("/") + "/"
    with open("/proc/self/mounts") as fh:
        points = [line.split()[1] for line in fh]
    return [p for p in points if p == str(path) or p.startswith(prefix)]


def unmount_under(path: Path, keep: tuple[str, ...] = ()) -> None:
    """Lazily unmount every mount at or under ``path`` but those in ``keep``, deepest first."""
    for point in sorted(mounts_under(path), key=len, reverse=True):
        if point not in keep:
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def restore(before: HostState) -> None:
    """Put back the sysctls that changed, unmount what was mounted and remove what appeared
    under the kubelet's host folders (the whole folder when it was absent)."""
    for key, value in before.sysctls:
        path = Path("/proc/sys") / key
        if path.read_text().strip() != value:
            path.write_text(value)
    for name, listing in before.trees:
        path = Path(name)
        unmount_under(path, keep=before.mounts)
        if listing is None:
            _remove(path)
            continue
        for entry in sorted(_tree(path) or (), key=len, reverse=True):
            if entry not in listing:
                _remove(Path(entry))


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file() or path.is_socket():
        path.unlink(missing_ok=True)
    elif path.is_dir():
        for entry in sorted(_tree(path) or (), key=len, reverse=True):
            _remove(Path(entry))
        path.rmdir()
    elif path.exists():
        path.unlink()


def differences(before: HostState, after: HostState) -> list[str]:
    """What differs between two snapshots, one line each."""
    out = [
        f"sysctl {k}: {v} before, {dict(after.sysctls)[k]} now"
        for k, v in before.sysctls
        if dict(after.sysctls)[k] != v
    ]
    out += [f"{m} is mounted" for m in sorted(set(after.mounts) - set(before.mounts))]
    now = dict(after.trees)
    for name, listing in before.trees:
        if listing is None and now[name] is not None:
            out.append(f"{name} was absent and exists now")
        elif listing is not None and now[name] is None:
            out.append(f"{name} existed and is gone")
        elif listing is not None and now[name] is not None:
            added = sorted(set(now[name] or ()) - set(listing))
            removed = sorted(set(listing) - set(now[name] or ()))
            out += [f"{p} is new" for p in added] + [f"{p} is gone" for p in removed]
    return out
