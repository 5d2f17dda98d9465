"""The byte pre-check: the one table of GPU markers (a leaf: no imports at all).

Byte strings whose absence from ``config.json`` proves that no request channel of
:func:`gpuhook.pipeline.request.parse` can carry a GPU request (a unit test checks them against
the channels). JSON may escape ``/`` as ``\\/`` and any character as ``\\uXXXX``: a file that
contains ``\\u`` always gets the full parse, and no marker contains ``/``. The shim and the
installed dispatcher's build step (:mod:`gpuhook.runtime.dispatch`: one ``memmem`` per
marker and ``\\u``) read this table; nothing keeps a copy.
"""

PRECHECK_MARKERS = (
    b"NVIDIA_VISIBLE_DEVICES",
    b"cdi.k8s.io",
    b"nvidia-container-devices",
    b"nvidia-container-runtime-hook",
    b"nvidia-container-toolkit",  # the legacy hooks.d hook: `nvidia-container-toolkit prestart`
    # an NVIDIA device node the engine injected (a CDI spec, --device), by its major: as Go's
    # encoding/json writes config.json (every engine), and indented
    b'"major":195',
    b'"major": 195',
)
UNICODE_ESCAPE = b"\\u"


def may_request_gpu(raw: bytes) -> bool:
    """False proves that the spec carries no GPU request at all (True when it may)."""
    if UNICODE_ESCAPE in raw:
        return True
    return any(marker in raw for marker in PRECHECK_MARKERS)
