"""The byte-level pre-check is sound: whenever the full parser finds a request, the pre-check
must say "maybe" (a false "no" would hand a GPU request to runc untouched)."""

from __future__ import annotations

import json
import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhook import markers
from gpuhook.pipeline import request
from tests import factories as f

_ids = st.sampled_from(["0", "all", "none", "void", "", "GPU-abc", "nvidia.com/gpu=1", "1:0"])


@st.composite
def _spec(draw: st.DrawFn) -> dict[str, Any]:
    env = draw(
        st.lists(
            st.sampled_from(["PATH=/bin", "A=b", "NVIDIA_DRIVER_CAPABILITIES=all"]), max_size=3
        )
    )
    if draw(st.booleans()):
        env.append(f"NVIDIA_VISIBLE_DEVICES={draw(_ids)}")
    annotations = {}
    if draw(st.booleans()):
        annotations[f"cdi.k8s.io/{draw(st.text(max_size=5))}"] = draw(_ids)
    if draw(st.booleans()):
        annotations.update(f.k8s())
    mounts = []
    if draw(st.booleans()):
        root = draw(st.sampled_from(request.MARKER_ROOTS))
        mounts.append({"destination": root + draw(_ids), "source": "/dev/null"})
    hooks = None
    if draw(st.booleans()):
        hooks = {"prestart": [{"path": "/usr/bin/nvidia-container-runtime-hook"}]}
    out = f.spec(
        env=env, annotations=annotations, mounts=mounts, hooks=hooks, privileged=draw(st.booleans())
    )
    if draw(st.booleans()):  # a device node the engine injected (a CDI spec, --device)
        major = draw(st.sampled_from([195, 1, 511]))
        node = {"path": "/dev/x", "type": "c", "major": major, "minor": draw(st.integers(0, 255))}
        out["linux"]["devices"] = [node]
    return out


def _escape_slashes_and_some_chars(text: str, seed: int) -> str:
    """Re-escape some characters inside JSON strings as \\/ or \\uXXXX (still equal JSON)."""
    rnd = random.Random(seed)
    out = []
    i = 0
    in_string = False
    while i < len(text):
        ch = text[i]
        if in_string and ch == "\\":  # copy an existing escape sequence whole
            length = 6 if text[i + 1] == "u" else 2
            out.append(text[i : i + length])
            i += length
            continue
        if ch == '"':
            in_string = not in_string
        elif in_string and ch == "/" and rnd.random() < 0.5:
            out.append("\\/")  # the escape that needs no \\u and so must be caught by markers
            i += 1
            continue
        elif in_string and rnd.random() < 0.01:
            out.append(f"\\u{ord(ch):04x}")
            i += 1
            continue
        out.append(ch)
        i += 1
    return "".join(out)


@settings(max_examples=600, deadline=None)
@given(_spec(), st.booleans(), st.integers(0, 2**16))
def test_precheck_never_misses_a_request(spec: dict[str, Any], ascii_only: bool, seed: int) -> None:
    for text in (
        json.dumps(spec, ensure_ascii=ascii_only),
        json.dumps(spec, indent=2),
        json.dumps(spec, separators=(",", ":")),  # as Go's encoding/json writes it (engines)
        _escape_slashes_and_some_chars(json.dumps(spec), seed),
    ):
        assert json.loads(text) == spec
        parsed = request.parse(json.loads(text))
        if parsed.channels or parsed.engine_devices:
            assert markers.may_request_gpu(text.encode())


def test_precheck_says_no_for_a_plain_container() -> None:
    assert not markers.may_request_gpu(json.dumps(f.spec(annotations=f.k8s())).encode())


def test_precheck_escape_means_full_parse() -> None:
    assert markers.may_request_gpu(b'{"a": "\\u0041"}')
