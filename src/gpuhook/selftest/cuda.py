"""The CUDA program of ``selftest --cuda``: the operator's (``--cuda-program``), or
:data:`SOURCE` built with the host's nvcc, and what its output says.

The program runs inside the GPU containers with what gpuhook-runtime injected (libcuda, the
device nodes, the MPS pipe). :data:`SOURCE` prints ``key: value`` lines (``device``, ``uuid``,
``sms``, ``alloc``) and ``ok``; another program passes when it exits 0, and whatever of those
keys it prints is reported.
"""

from __future__ import annotations

import os
import subprocess
from typing import TYPE_CHECKING

from gpuhook.config import locate
from gpuhook.model.frozen import Frozen

if TYPE_CHECKING:
    from collections.abc import Iterable

    from gpuhook.selftest.bundle import Section

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda_probe.cu")
NVCC_FALLBACKS = ("/usr/local/cuda/bin/nvcc",)
BUILD_TIMEOUT_S = 600


class Program(Frozen):
    """The CUDA program: its host path ("" when there is none) and where it came from, or why
    there is none (``problem``: a failed build)."""

    path: str
    origin: str
    problem: str = ""


def find_nvcc() -> str:
    """nvcc on PATH (and the system folders), in $CUDA_HOME/bin, else in /usr/local/cuda/bin."""
    found = locate.which("nvcc")
    if found:
        return found
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or ""
    for candidate in ((os.path.join(home, "bin", "nvcc"),) if home else ()) + NVCC_FALLBACKS:
        if locate.which(candidate):
            return candidate
    return ""


def program(given: str, work_dir: str, capabilities: Iterable[str]) -> Program:
    """The program to run: ``given`` (checked), else :data:`SOURCE` built with nvcc into
    ``work_dir`` for the GPUs' compute ``capabilities`` ("9.0"), else none."""
    if given:
        path = os.path.abspath(given)
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            return Program("", "--cuda-program", f"{path} is not an executable file")
        return Program(path, f"--cuda-program {path}")
    nvcc = find_nvcc()
    if not nvcc:
        return Program("", "")
    out = os.path.join(work_dir, "gpuhook-cuda-probe")
    argv = [nvcc, "-O2", "-cudart", "static", "-o", out, SOURCE]
    archs = sorted({c.replace(".", "") for c in capabilities if c.replace(".", "").isdigit()})
    for arch in archs:
        argv += ["-gencode", f"arch=compute_{arch},code=sm_{arch}"]
        argv += ["-gencode", f"arch=compute_{arch},code=compute_{arch}"]
    try:
        built = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            check=False,
            stdin=subprocess.DEVNULL,
            cwd=work_dir,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Program("", f"built with {nvcc}", f"cannot run it: {exc}")
    origin = f"built with {nvcc}" + (f" for sm_{', sm_'.join(archs)}" if archs else "")
    if built.returncode != 0:
        lines = [line for line in (built.stderr + built.stdout).splitlines() if line.strip()]
        why = lines[-1].strip() if lines else f"exit code {built.returncode}"
        return Program("", origin, f"failed: {why}")
    return Program(out, origin)


def values(section: Section) -> dict[str, str]:
    """The ``key: value`` lines of the program's output."""
    found: dict[str, str] = {}
    for line in section.lines:
        key, colon, value = line.partition(":")
        if colon and key.strip():
            found.setdefault(key.strip(), value.strip())
    return found


def judge(section: Section | None, expected_uuid: str, mps_note: str) -> tuple[bool, str]:
    """(passed, the line to report) for the program's run in one container. ``expected_uuid``:
    the device the container was granted; ``mps_note``: the MPS limit, when under MPS."""
    if section is None:
        return False, "the program did not run in the container (not found there)"
    if section.code is None:
        return False, "the program did not finish (the container ended first)"
    got = values(section)
    if section.code != 0:
        why = got.get("error") or section.last() or "no output"
        return False, f"exited with {section.code}: {why}"
    parts = []
    if got.get("device"):
        parts.append(got["device"] + (f" ({got['uuid']})" if got.get("uuid") else ""))
    if got.get("sms"):
        parts.append(f"{got['sms']} SMs" + (f" ({mps_note})" if mps_note else ""))
    if got.get("alloc", "").isdigit():
        parts.append(f"allocated {int(got['alloc']) >> 20} MiB and ran a kernel on it")
    uuid = got.get("uuid", "")
    if uuid and expected_uuid.startswith("GPU-") and uuid.lower() != expected_uuid.lower():
        return False, f"CUDA's device 0 is {uuid}, not the granted {expected_uuid}"
    return True, ", ".join(parts) or f"exited with 0: {section.last() or 'no output'}"
