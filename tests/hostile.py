"""Helpers for the adversarial tests: host-side sentinels an attack would have to touch, a mount
table filter, and a planted shared library that leaves a marker wherever it is loaded."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

# Deep enough to climb out of any rootfs the tests build: resolved on the host, it is the
# absolute path that follows it; resolved inside a rootfs (as runc and ldconfig -r do), it stays.
CLIMB = "../" * 24


class Host:
    """A host-side tree that hostile images point their symlinks at: ``dir`` (a folder with
    files and a subfolder), ``file`` (a regular file), and ``markers`` (where the planted
    library reports host-side loads). ``snapshot()`` records everything an attack could change."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.dir = root / "dir"
        self.file = root / "file"
        self.markers = root / "markers"
        (self.dir / "sub").mkdir(parents=True)
        (self.dir / "a.conf").write_text("/host/lib\n")
        (self.dir / "sub" / "b").write_text("host b\n")
        self.file.write_text("host file: must never change\n")
        self.markers.mkdir()

    def snapshot(self) -> dict[str, Any]:
        """Every path under the tree: type, mode, owner, size, content hash, link target, mtime."""
        out: dict[str, Any] = {}
        for folder, dirs, files in os.walk(self.root, followlinks=False):
            for name in sorted(dirs + files):
                path = os.path.join(folder, name)
                st = os.lstat(path)
                entry: dict[str, Any] = {
                    "mode": stat.filemode(st.st_mode),
                    "uid": st.st_uid,
                    "size": st.st_size if stat.S_ISREG(st.st_mode) else None,
                    "mtime": st.st_mtime_ns,
                }
                if stat.S_ISLNK(st.st_mode):
                    entry["link"] = os.readlink(path)
                elif stat.S_ISREG(st.st_mode):
                    entry["sha"] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
                out[os.path.relpath(path, self.root)] = entry
        return out

    def changes(self, before: dict[str, Any]) -> dict[str, str]:
        """What changed since ``before``: path -> 'added <mode> [-> link]', 'removed', 'changed'.
        Comparable between two Host trees that received the same treatment."""
        after = self.snapshot()
        out: dict[str, str] = {}
        for path in sorted(set(before) | set(after)):
            if path not in after:
                out[path] = "removed"
            elif path not in before:
                link = after[path].get("link")
                out[path] = f"added {after[path]['mode']}" + (f" -> {link}" if link else "")
            elif after[path] != before[path]:
                out[path] = "changed"
        return out

    def loads(self) -> list[str]:
        """What the planted library wrote on the host: one line per load, 'pid exe'."""
        return sorted(p.read_text().strip() for p in self.markers.iterdir())


def mounts_under(*prefixes: str | Path) -> list[tuple[str, str, str]]:
    """``(mount point, fs type, source)`` of this mount namespace's mounts under any prefix.

    Other test sessions may mount and unmount elsewhere on the machine at the same time, so
    the tests compare only the part of the table an attack on their own paths would change.
    """
    wanted = [str(p).rstrip("/") + "/" for p in prefixes]
    out = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            fields = line.split()
            point = fields[4].replace("\\040", " ")
            sep = fields.index("-")
            fstype, source = fields[sep + 1], fields[sep + 2]
            if any((point + "/").startswith(w) for w in wanted):
                out.append((point, fstype, source))
    return sorted(out)


PLANTED_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

__attribute__((constructor)) static void planted(void) {
    char exe[512] = "?", path[1024], line[700];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) exe[n] = 0;
    snprintf(path, sizeof path, "%s/loaded-%d", MARKER_DIR, (int)getpid());
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return;
    int len = snprintf(line, sizeof line, "%d %s\n", (int)getpid(), exe);
    if (write(fd, line, len) < 0) {}
    close(fd);
}
"""


def build_planted_library(dest: Path, marker_dir: Path) -> Path:
    """A shared library whose constructor writes ``<marker_dir>/loaded-<pid>`` ('pid exe') in
    whatever root the loading process sees: the same absolute path names a host folder for a
    host process and a folder of the image for a process inside the container."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    src = dest.with_suffix(".c")
    src.write_text(PLANTED_C)
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-O2",
            f'-DMARKER_DIR="{marker_dir}"',
            "-o",
            str(dest),
            str(src),
        ],
        check=True,
        capture_output=True,
    )
    src.unlink()
    return dest


def one_line_failure(stderr: str) -> str:
    """The single line a failed create printed (asserting there is exactly one, no traceback)."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]
