"""Real containers for gpuhook's tests and demo: a minimal glibc rootfs, OCI bundles made from
``runc spec``, and runs through ``gpuhook-runtime`` (or plain runc) with a private state root.

Stdlib only; needs root, runc and busybox-static (./dev installs them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The executables under test: this checkout's build/bin dispatchers, or the folder named by
# GPUHOOK_TEST_EXECUTABLES (e.g. /usr/bin, to run the suite against the installed .deb).
BUILD_BIN = os.environ.get("GPUHOOK_TEST_EXECUTABLES") or os.path.join(REPO, "build", "bin")
RUNTIME = os.path.join(BUILD_BIN, "gpuhook-runtime")
GPUHOOK = os.path.join(BUILD_BIN, "gpuhook")

APPLETS = (
    "sh",
    "ls",
    "cat",
    "echo",
    "test",
    "[",
    "grep",
    "sort",
    "head",
    "tail",
    "wc",
    "env",
    "id",
    "mkdir",
    "rm",
    "ln",
    "stat",
    "readlink",
    "true",
    "false",
    "sleep",
    "find",
    "tr",
    "cut",
    "touch",
    "mount",
    "printf",
    "basename",
    "dirname",
    "xargs",
    "sed",
    "awk",
)
LIBC_FILES = (
    "/lib64/ld-linux-x86-64.so.2",
    "/lib/x86_64-linux-gnu/libc.so.6",
    "/lib/x86_64-linux-gnu/libm.so.6",
    "/lib/x86_64-linux-gnu/libdl.so.2",
    "/lib/x86_64-linux-gnu/libpthread.so.0",
)


def build_rootfs(dest: str) -> str:
    """A small glibc userland: busybox applets, the dynamic loader and libc, glibc's ldconfig,
    and an /etc/ld.so.conf that includes /etc/ld.so.conf.d (as Debian's)."""
    busybox = shutil.which("busybox") or "/bin/busybox"
    for d in (
        "bin",
        "sbin",
        "etc/ld.so.conf.d",
        "lib/x86_64-linux-gnu",
        "lib64",
        "usr/bin",
        "usr/lib/x86_64-linux-gnu",
        "proc",
        "sys",
        "dev",
        "tmp",
        "run",
        "var/run",
    ):
        os.makedirs(os.path.join(dest, d), exist_ok=True)
    shutil.copy2(busybox, os.path.join(dest, "bin/busybox"))
    for applet in APPLETS:
        link = os.path.join(dest, "bin", applet)
        if not os.path.lexists(link):
            os.symlink("busybox", link)
    for path in LIBC_FILES:
        real = os.path.realpath(path)
        target = os.path.join(dest, path.lstrip("/"))
        if os.path.exists(real) and not os.path.exists(target):
            shutil.copy2(real, target)
    shutil.copy2("/sbin/ldconfig", os.path.join(dest, "sbin/ldconfig"))
    with open(os.path.join(dest, "etc/ld.so.conf"), "w") as fh:
        fh.write("include /etc/ld.so.conf.d/*.conf\n")
    with open(os.path.join(dest, "etc/ld.so.conf.d/x86_64-linux-gnu.conf"), "w") as fh:
        fh.write("/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n")
    with open(os.path.join(dest, "etc/passwd"), "w") as fh:
        fh.write("root:x:0:0:root:/root:/bin/sh\n")
    subprocess.run(["/sbin/ldconfig", "-r", dest], check=True, capture_output=True)
    return dest


# A big image's libraries (a CUDA or PyTorch image carries thousands in ld.so.conf.d folders):
# copies of one small shared object, each given its own soname in place of this placeholder.
BIG_SONAME = b"libimage_XXXXXXXX.so.1"


def add_libraries(rootfs: str, count: int, folders: int = 12) -> list[str]:
    """``count`` ELF shared libraries with distinct sonames (``libimage_00000000.so.1``...)
    spread over ``folders`` folders /opt/libN, each named by its own /etc/ld.so.conf.d file,
    then the image's own ld.so.cache (``ldconfig -r``), as an image build leaves them. Returns
    the folders."""
    work = os.path.join(rootfs, ".gen")
    os.makedirs(work, exist_ok=True)
    src, template = os.path.join(work, "lib.c"), os.path.join(work, "lib.so")
    with open(src, "w") as fh:
        fh.write("int image_library(void) { return 1; }\n")
    soname = BIG_SONAME.decode()
    small = "-Wl,-z,noseparate-code,-z,max-page-size=4096,-z,norelro,--build-id=none"
    gcc = ["gcc", "-shared", "-fPIC", "-nostdlib", "-s", small, f"-Wl,-soname,{soname}"]
    subprocess.run([*gcc, "-o", template, src], check=True, capture_output=True)
    with open(template, "rb") as fh:
        data = fh.read()
    shutil.rmtree(work)
    paths = [f"/opt/lib{n}" for n in range(folders)]
    for n, folder in enumerate(paths):
        os.makedirs(rootfs + folder, exist_ok=True)
        with open(os.path.join(rootfs, f"etc/ld.so.conf.d/{n:02d}-lib{n}.conf"), "w") as fh:
            fh.write(folder + "\n")
    for i in range(count):
        name = f"libimage_{i:08d}.so.1"
        with open(f"{rootfs}{paths[i % folders]}/{name}", "wb") as fh:
            fh.write(data.replace(BIG_SONAME, name.encode()))
    subprocess.run(["/sbin/ldconfig", "-r", rootfs], check=True, capture_output=True)
    return paths


def base_spec(scratch: str) -> dict[str, Any]:
    """The spec ``runc spec`` writes (real defaults: namespaces, /proc, /dev, cgroup deny-all)."""
    os.makedirs(scratch, exist_ok=True)
    path = os.path.join(scratch, "config.json")
    if os.path.exists(path):
        os.unlink(path)
    subprocess.run(["runc", "spec", "--bundle", scratch], check=True, capture_output=True)
    with open(path) as fh:
        spec: dict[str, Any] = json.load(fh)
    os.unlink(path)
    return spec


# Linux capability numbers 0..40 (linux/capability.h), for reading a bounding set.
CAPABILITIES = [
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
]


def host_capabilities() -> list[str]:
    """The capabilities of this process's bounding set (what an engine on this host grants a
    privileged container: this VM's root lacks CAP_SYS_RESOURCE)."""
    with open("/proc/self/status") as fh:
        mask = int(next(line for line in fh if line.startswith("CapBnd:")).split()[1], 16)
    return [f"CAP_{name}" for bit, name in enumerate(CAPABILITIES) if mask >> bit & 1]


def make_bundle(
    bundle: str,
    rootfs_template: str,
    args: Sequence[str] = ("/bin/sh", "-c", "true"),
    env: Sequence[str] = (),
    annotations: Mapping[str, str] | None = None,
    mounts: Sequence[Mapping[str, Any]] = (),
    privileged: bool = False,
    hooks: Mapping[str, Any] | None = None,
    spec_template: dict[str, Any] | None = None,
    add_caps: Sequence[str] = (),
) -> str:
    """An OCI bundle with its own copy of the rootfs (runc creates mount targets in it).
    ``privileged``: as engines write a privileged container (every capability this host's
    bounding set has, the device cgroup open); ``add_caps``: capabilities added to an
    unprivileged one (a pod's securityContext.capabilities.add)."""
    os.makedirs(bundle, exist_ok=True)
    rootfs = os.path.join(bundle, "rootfs")
    if not os.path.exists(rootfs):
        shutil.copytree(rootfs_template, rootfs, symlinks=True)
    spec = json.loads(json.dumps(spec_template)) if spec_template else base_spec(bundle)
    spec["process"]["terminal"] = False
    spec["process"]["args"] = list(args)
    spec["process"]["env"] = ["PATH=/usr/sbin:/usr/bin:/sbin:/bin", *env]
    spec["root"] = {"path": "rootfs", "readonly": False}
    if annotations:
        spec["annotations"] = dict(annotations)
    spec["mounts"] = list(spec.get("mounts", [])) + [dict(m) for m in mounts]
    caps = spec["process"]["capabilities"]
    for key in caps:
        wanted = host_capabilities() if privileged else add_caps
        caps[key] += [c for c in wanted if c not in caps[key]]
    if privileged:  # as engines write it: every capability, the device cgroup open to all
        spec["linux"].setdefault("resources", {})["devices"] = [{"allow": True, "access": "rwm"}]
    if hooks:
        spec["hooks"] = dict(hooks)
    with open(os.path.join(bundle, "config.json"), "w") as fh:
        json.dump(spec, fh, indent=2)
    return bundle


def run_container(
    bundle: str,
    container_id: str,
    state_root: str,
    env: Mapping[str, str],
    runtime: str = RUNTIME,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """``<runtime> --root STATE run --bundle BUNDLE ID`` in the foreground; the container is
    deleted afterwards (runc run removes it when it exits)."""
    full_env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), **env}
    return subprocess.run(
        [runtime, "--root", state_root, "run", "--bundle", bundle, container_id],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )


PROBE = (
    "ls -1 /dev | grep '^nvidia' | sort; "
    "if [ -d /dev/nvidia-caps ]; then ls -1 /dev/nvidia-caps | sed 's|^|nvidia-caps/|'; fi; "
    "echo '--- env'; env | grep -E '^(NVIDIA|CUDA)_' | sort; "
    "echo '--- ldconfig'; ldconfig -p | grep -E 'nvidia|cuda' | sed 's/ (.*) => / => /' | sort; "
    "echo '--- smi'; if [ -x /usr/bin/nvidia-smi ]; then /usr/bin/nvidia-smi -L; "
    "echo rc=$?; fi; echo '--- end'"
)


def parse_probe(stdout: str) -> dict[str, Any]:
    """Split the output of PROBE into what a test asserts on."""
    sections: dict[str, list[str]] = {"dev": [], "env": [], "ldconfig": [], "smi": []}
    current = "dev"
    for line in stdout.splitlines():
        if line.startswith("--- "):
            current = line[4:].strip()
            continue
        if current in sections and line.strip():
            sections[current].append(line.strip())
    env = dict(item.split("=", 1) for item in sections["env"] if "=" in item)
    return {
        "dev": sorted("/dev/" + d for d in sections["dev"]),
        "env": env,
        "ldconfig": sections["ldconfig"],
        "smi": sections["smi"],
    }
