"""The build step makes both dispatchers from gpuhook's tables: every template name is known, the
sh output is valid sh, the C source carries the tables' values (no copy kept by hand), and the
interpreter command is written into (and read back from) the compiled binary's region."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpuhook import markers
from gpuhook.config import cache as config_cache
from gpuhook.pipeline import inject
from gpuhook.runtime import dispatch, hooks, ldmerge, locate, runc_argv, wire

REPO = Path(__file__).resolve().parents[2]


def test_the_sh_template_renders_to_valid_sh(tmp_path: Path) -> None:
    out = tmp_path / "dispatcher"
    out.write_text(dispatch.render((REPO / "packaging" / "gpuhook.in").read_text(), "/py", "/pkg"))
    assert subprocess.run(["dash", "-n", str(out)], check=False).returncode == 0
    assert "exec /py -I -S /pkg/gpuhook/_" in out.read_text()


def test_the_runtime_dispatcher_carries_the_tables() -> None:
    text = dispatch.render_c((REPO / "packaging" / "gpuhook-runtime.c.in").read_text())
    for marker in (*markers.PRECHECK_MARKERS, markers.UNICODE_ESCAPE):
        escaped = marker.decode().replace("\\", "\\\\").replace('"', '\\"')
        assert '"' + escaped + '"' in text
    for scope, table in [("g", runc_argv.GLOBAL_FLAGS), *runc_argv.COMMAND_FLAGS.items()]:
        for flag in table:
            assert f'"{scope}:{flag}"' in text, (scope, flag)
    assert f"#define UNTRUSTED_MODE 0{config_cache.UNTRUSTED_MODE:o}" in text
    assert f'PROTOCOL[] = "{wire.PROTOCOL.decode()}"' in text
    assert re.search("@[A-Z_]+@", text) is None


def test_the_interpreter_command_is_written_into_the_binary_and_read_back() -> None:
    head = locate.DISPATCHER_MARK + b"\0"
    binary = b"ELF..." + head + bytes(dispatch.RELOCATION_SIZE - len(head)) + b"...end"
    command = dispatch.python_command("/opt/x/ld.so --library-path /opt/x /opt/x/python3", "/s")
    moved = dispatch.relocate(binary, command)
    assert len(moved) == len(binary) and moved.endswith(b"...end")
    assert dispatch.command_of(moved) == command == [
        "/opt/x/ld.so", "--library-path", "/opt/x", "/opt/x/python3", "-I", "-S",
        "/s/gpuhook/_shim_entry.py",
    ]  # fmt: skip
    assert dispatch.command_of(dispatch.relocate(moved, ["/py"])) == ["/py"]
    with pytest.raises(ValueError, match="longer than"):
        dispatch.relocate(binary, ["/" + "x" * dispatch.RELOCATION_SIZE])
    with pytest.raises(ValueError, match="not a gpuhook-runtime dispatcher"):
        dispatch.relocate(b"#!/bin/sh\n", command)
    with pytest.raises(ValueError, match="not a gpuhook-runtime dispatcher"):
        dispatch.relocate(binary + binary, command)
    with pytest.raises(ValueError, match="not an interpreter command"):
        dispatch.relocate(binary, ["/py", ""])


def test_the_built_dispatcher_is_one() -> None:
    binary = (REPO / "build" / "bin" / "gpuhook-runtime").read_bytes()
    assert binary.startswith(b"\x7fELF") and dispatch.command_of(binary)[1:3] == ["-I", "-S"]
    assert locate._is_gpuhook_runtime(str(REPO / "build" / "bin" / "gpuhook-runtime"))


def test_the_ldcache_hook_carries_the_bounds_flags_and_steps() -> None:
    """The static dispatcher's C hook: the bounds, flags and environment of
    gpuhook.runtime.hooks, the merge's names and ldconfig flags of gpuhook.runtime.ldmerge."""
    text = dispatch.render_c((REPO / "packaging" / "gpuhook-runtime.c.in").read_text())
    assert f"#define LDC_DATA_LIMIT {hooks.LDCONFIG_DATA_LIMIT}\n" in text
    assert f"#define LDC_CPU_S {hooks.LDCONFIG_CPU_S}\n" in text
    assert f"#define LDC_TIMEOUT_MAX_S {hooks.LDCONFIG_TIMEOUT_MAX_S}\n" in text
    assert f"#define LDC_TIMEOUT_S {int(hooks.LDCONFIG_TIMEOUT_S)}\n" in text
    assert ", ".join(f'"{f}"' for f in hooks.UPDATE_LDCACHE_FLAGS) in text
    assert ", ".join(f'"{k}={v}"' for k, v in hooks.SAFE_ENV.items()) in text
    assert ", ".join(f'"{f}"' for f in ldmerge.FOLDER_FLAGS) in text
    assert f'CMD_HOOK[] = "{runc_argv.HOOK}"' in text
    assert runc_argv.HOOK == inject.HOOK_COMMAND  # what the spec's hook says, what runs it


def test_the_cli_dispatcher_only_starts_python() -> None:
    """The ldcache hook no longer runs in sh: the gpuhook dispatcher execs Python, nothing else."""
    text = dispatch.render((REPO / "packaging" / "gpuhook.in").read_text(), "/p", "/k")
    code = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert code == ['GPUHOOK_SELF=$0 exec /p -I -S /k/gpuhook/_cli_entry.py "$@"']


def test_an_unknown_template_name_fails_the_build() -> None:
    with pytest.raises(ValueError, match="NO_SUCH"):
        dispatch.render("echo @NO_SUCH@\n", "/p", "/k")


def test_make_rebuilds_the_dispatchers_when_any_module_they_render_from_changes() -> None:
    """The modules rendering imports (runtime.dispatch and what it pulls in, records/ids.py,
    runtime/ocispec.py and fsutil.py among them): with any of them newer, `make` renders and
    compiles again (`-W` pretends the file changed; `-n` runs nothing)."""
    code = (
        "import sys, gpuhook.runtime.dispatch as d; d.render_c(open(sys.argv[1]).read()); "
        "print('\\n'.join(sorted({m.__file__ for n, m in sys.modules.items() "
        "if n.startswith('gpuhook') and getattr(m, '__file__', None)})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(REPO / "packaging" / "gpuhook-runtime.c.in")],
        capture_output=True, text=True, check=True, cwd=REPO,
    )  # fmt: skip
    modules = [Path(p) for p in out.stdout.split()]
    names = {p.relative_to(REPO / "src").as_posix() for p in modules}
    assert {"gpuhook/records/ids.py", "gpuhook/runtime/ocispec.py", "gpuhook/fsutil.py"} <= names
    for module in modules:
        for target in ("build/bin/gpuhook-runtime", "build/bin/gpuhook"):
            plan = subprocess.run(
                ["make", "-n", "-W", str(module.relative_to(REPO)), target],
                capture_output=True, text=True, check=True, cwd=REPO,
            )  # fmt: skip
            assert "gpuhook.runtime.dispatch" in plan.stdout, (module, target)
