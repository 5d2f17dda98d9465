"""The pure parts of gpuhook.runtime.fastpath agree with the modules they stand in for: the
constants, the container-id rule, path normalisation and JSON safety."""

from __future__ import annotations

import json
import os
import posixpath

from hypothesis import given
from hypothesis import strategies as st

from gpuhook import config, fsutil
from gpuhook import markers as gpuhook_markers
from gpuhook.pipeline import request
from gpuhook.records import writer
from gpuhook.runtime import fastpath


def test_mirrored_constants() -> None:
    assert fastpath.ENV_CONFIG.decode() == config.ENV_CONFIG
    assert fastpath.ENV_DEBUG.decode() == config.ENV_DEBUG
    assert fastpath.DEFAULT_CONFIG == config.DEFAULT_PATH
    assert fastpath.CACHE_ROOT == config.CACHE_ROOT
    assert fastpath.TMP_MARK == fsutil.TMP_MARK
    assert fastpath.cache_path("/etc/g.yaml").startswith(config.cache_dir_for("/etc/g.yaml") + "/")


def test_precheck_markers_cover_every_channel() -> None:
    """Each request channel's literal appears among the markers (the soundness argument of the
    pre-check; tests/unit/test_precheck.py checks it against the parser)."""
    markers = gpuhook_markers.PRECHECK_MARKERS
    assert request.ENV_VISIBLE.encode() in markers
    assert request.DOCKER_HOOK.encode() in markers
    assert any(m in request.CDI_ANNOTATION_PREFIX.encode() for m in markers)
    for root in request.MARKER_ROOTS:
        assert any(m in root.encode() for m in markers)
    assert all(b"/" not in m for m in markers)


_id_chars = st.sampled_from("abcXYZ019_+-.:/ é\x00")


@given(st.text(alphabet=_id_chars, max_size=12))
def test_fast_ids_are_valid_record_ids(cid: str) -> None:
    assert fastpath._safe_id(cid) == writer.valid_id(cid)


@given(st.lists(st.sampled_from(["a", "b", ".", "..", "", "x y"]), max_size=8))
def test_normpath_matches_posixpath(parts: list[str]) -> None:
    for lead in ("/", "//", "///"):
        path = lead + "/".join(parts)
        assert fastpath._normpath(path) == posixpath.normpath(path)


def test_abspath_of_relative_bundle(tmp_path: str) -> None:
    here = os.getcwd()
    try:
        os.chdir(tmp_path)
        for rel in (".", "b", "./b/../c", "b/"):
            assert fastpath._abspath(rel) == os.path.abspath(rel)
    finally:
        os.chdir(here)


@given(st.text(max_size=20))
def test_json_safe_text_is_its_own_json_string(text: str) -> None:
    if fastpath._json_safe(text):
        assert json.dumps(text) == f'"{text}"'


def test_may_request_gpu() -> None:
    assert not gpuhook_markers.may_request_gpu(b'{"process":{"env":["PATH=/bin"]}}')
    assert gpuhook_markers.may_request_gpu(b'{"process":{"env":["NVIDIA_VISIBLE_DEVICES=0"]}}')
    assert gpuhook_markers.may_request_gpu(
        b'{"process":{"env":["NVIDIA\\u005fVISIBLE_DEVICES=0"]}}'
    )
