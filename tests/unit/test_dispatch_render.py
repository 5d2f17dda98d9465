"""The build step renders both sh dispatchers from gpuhook's tables: every template name is known,
the output is valid sh, and what it carries is the tables' (no copy kept by hand)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gpuhook import config, markers
from gpuhook.runtime import dispatch, hooks, runc_argv

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["gpuhook-runtime.in", "gpuhook.in"])
def test_templates_render_to_valid_sh(name: str, tmp_path: Path) -> None:
    out = tmp_path / "dispatcher"
    out.write_text(dispatch.render((REPO / "packaging" / name).read_text(), "/py", "/pkg"))
    assert subprocess.run(["dash", "-n", str(out)], check=False).returncode == 0
    assert "exec /py -I -S /pkg/gpuhook/_" in out.read_text()


def test_the_runtime_dispatcher_carries_the_tables() -> None:
    text = dispatch.render((REPO / "packaging" / "gpuhook-runtime.in").read_text(), "/p", "/k")
    for marker in (*markers.PRECHECK_MARKERS, markers.UNICODE_ESCAPE):
        assert f"-e '{marker.decode()}'" in text
    for scope, table in [("g", runc_argv.GLOBAL_FLAGS), *runc_argv.COMMAND_FLAGS.items()]:
        for flag in table:
            assert f"{scope}:{flag}|" in text or f"{scope}:{flag})" in text, (scope, flag)
    assert '[ -O "$p" ] && [ -u "$p" ]' in text and f"mode {config.POINTER_MODE:04o}" in text


def test_the_hook_dispatcher_carries_the_bounds() -> None:
    text = dispatch.render((REPO / "packaging" / "gpuhook.in").read_text(), "/p", "/k")
    assert (
        f"ulimit -d {hooks.LDCONFIG_DATA_LIMIT >> 10} && ulimit -t {hooks.LDCONFIG_CPU_S}" in text
    )
    assert f"-le {hooks.LDCONFIG_TIMEOUT_MAX_S} ]" in text
    assert "|".join(hooks.UPDATE_LDCACHE_FLAGS) in text


def test_an_unknown_template_name_fails_the_build() -> None:
    with pytest.raises(ValueError, match="NO_SUCH"):
        dispatch.render("echo @NO_SUCH@\n", "/p", "/k")
