"""The self test's OCI bundles: the spec (what ``runc spec`` writes, as an unprivileged engine
container: default namespaces, capabilities and device cgroup), and the probe each container
runs (POSIX sh builtins only, so that busybox, dash and bash all run it) with the parser of what
it prints.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from gpuhook.model.frozen import Frozen, _init

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

# The variables a probe reports (gpuhook's grant and MPS limits).
ENV_NAMES = (
    "NVIDIA_VISIBLE_DEVICES",
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    "CUDA_MPS_LOG_DIRECTORY",
)
PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SMI = "smi"
MPS = "mps"
CUDA = "cuda"
MPS_QUESTION = "get_default_active_thread_percentage"
DONE = "@done"
CAPS = ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]
MASKED = [
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/sys/firmware",
    "/proc/scsi",
]
READONLY = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]


def spec(
    args: Sequence[str],
    env: Sequence[str],
    annotations: Mapping[str, str],
    cgroups_path: str = "",
) -> dict[str, Any]:
    """An OCI spec as ``runc spec`` makes it (runtime spec 1.0), for ``rootfs`` in the bundle;
    ``cgroups_path`` (absolute) where the runtime is to make the container's cgroup."""
    nosuid = ["nosuid", "noexec", "nodev"]
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": list(args),
            "env": [PATH, *env],
            "cwd": "/",
            "capabilities": {k: list(CAPS) for k in ("bounding", "effective", "permitted")},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
            "noNewPrivileges": True,
        },
        "root": {"path": "rootfs", "readonly": False},
        "hostname": "gpuhook-selftest",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {
                "destination": "/dev",
                "type": "tmpfs",
                "source": "tmpfs",
                "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
            },
            {
                "destination": "/dev/pts",
                "type": "devpts",
                "source": "devpts",
                "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"],
            },
            {
                "destination": "/dev/shm",  # noqa: S108 - in the container
                "type": "tmpfs",
                "source": "shm",
                "options": [*nosuid, "mode=1777", "size=65536k"],
            },
            {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": nosuid},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": [*nosuid, "ro"]},
        ],
        "annotations": dict(annotations),
        "linux": {
            "resources": {"devices": [{"allow": False, "access": "rwm"}]},
            "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")],
            "maskedPaths": list(MASKED),
            "readonlyPaths": list(READONLY),
            **({"cgroupsPath": cgroups_path} if cgroups_path else {}),
        },
    }


def write_spec(bundle: str, data: Mapping[str, Any]) -> bytes:
    """Write ``config.json`` into the bundle; the bytes written."""
    raw = json.dumps(data, indent=2).encode()
    with open(os.path.join(bundle, "config.json"), "wb") as fh:
        fh.write(raw)
    return raw


def probe(smi: str = "", mps_control: str = "", cuda: str = "", *, env: bool = True) -> str:
    """The script a container runs: its NVIDIA device nodes, gpuhook's variables (unless
    ``env`` is False: their names are GPU markers, which a spec meant to carry none must not
    hold), then each of the programs present (paths in the container; "" leaves one out) between
    begin and end lines that carry its exit code."""
    lines = ['for f in /dev/nvidia* /dev/nvidia-caps/*; do [ -e "$f" ] && echo "@dev $f"; done']
    if env:
        lines += [f'[ -n "${{{v}+x}}" ] && echo "@env {v}=${{{v}}}"' for v in ENV_NAMES]
    if smi:
        lines.append(_section(SMI, f"{smi} -L 2>&1", smi))
    if mps_control:
        ask = f"echo {MPS_QUESTION} | {mps_control} 2>&1"
        lines.append(
            f'if [ -n "${{CUDA_MPS_PIPE_DIRECTORY-}}" ]; then {_section(MPS, ask, mps_control)}; fi'
        )
    if cuda:
        lines.append(_section(CUDA, f"{cuda} 2>&1", cuda))
    lines.append(f"echo {DONE}")
    return "\n".join(lines) + "\n"


def _section(name: str, command: str, program: str) -> str:
    return f'if [ -x {program} ]; then echo "@begin {name}"; {command}; echo "@end {name} $?"; fi'


class Section(Frozen):
    """What one program printed in the container, and its exit code (None: it did not end)."""

    lines: tuple[str, ...]
    code: int | None

    def last(self) -> str:
        return next((line.strip() for line in reversed(self.lines) if line.strip()), "")


class Seen(Frozen):
    """What a probe saw: device nodes, gpuhook's variables, the programs' sections; ``done``
    when the script ran to its end."""

    dev: tuple[str, ...]
    env: dict[str, str]
    sections: dict[str, Section]
    done: bool

    def __init__(
        self, dev: tuple[str, ...], env: dict[str, str], sections: dict[str, Section], done: bool
    ) -> None:
        _init(self, dev=tuple(dev), env=dict(env), sections=dict(sections), done=done)

    def gpu_nodes(self) -> list[str]:
        """The ``/dev/nvidia<minor>`` nodes (GPUs), in minor order."""
        found = [d for d in self.dev if d[len("/dev/nvidia") :].isdigit()]
        return sorted(found, key=lambda d: int(d[len("/dev/nvidia") :]))

    def cap_nodes(self) -> list[str]:
        return sorted(d for d in self.dev if d.startswith("/dev/nvidia-caps/"))


def parse(stdout: str) -> Seen:
    dev: list[str] = []
    env: dict[str, str] = {}
    sections: dict[str, Section] = {}
    current: str | None = None
    lines: list[str] = []
    done = False
    for line in stdout.splitlines():
        if current is not None:
            head, _, rest = line.partition(" ")
            name, _, code = rest.partition(" ")
            if head == "@end" and name == current and code.strip().isdigit():
                sections[current] = Section(tuple(lines), int(code))
                current = None
            else:
                lines.append(line)
        elif line.startswith("@dev "):
            dev.append(line[5:].strip())
        elif line.startswith("@env "):
            key, _, value = line[5:].partition("=")
            env[key] = value
        elif line.startswith("@begin "):
            current, lines = line[7:].strip(), []
        elif line.strip() == DONE:
            done = True
    if current is not None:
        sections[current] = Section(tuple(lines), None)
    return Seen(tuple(sorted(dev)), env, sections, done)
