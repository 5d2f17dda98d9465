"""The runtime service: a resident gpuhook that decides GPU creates for ``gpuhook-runtime``.

Wire protocol (one ``SOCK_SEQPACKET`` message each way; the dispatcher's side is rendered from
these constants by :mod:`gpuhook.runtime.dispatch`):

request
    ``PROTOCOL NUL``, ``<argc> NUL``, argc NUL-terminated argv strings (argv[0] included),
    ``<envc> NUL``, envc NUL-terminated ``KEY=VALUE`` strings; with ``SCM_RIGHTS`` carrying
    exactly four descriptors: the caller's stdin, stdout, stderr and its working folder (opened
    ``O_PATH | O_DIRECTORY``).
reply
    :data:`EXEC` + the runtime's path: the dispatcher execs it with its own argv[1:];
    :data:`EXIT` + a decimal exit code: the dispatcher exits with it (the one-line error is
    already on its stderr); :data:`DECLINE` + a reason: the dispatcher starts Python itself.
"""

from __future__ import annotations

PROTOCOL = b"gpuhook-runtime/1"
EXEC = b"X"
EXIT = b"R"
DECLINE = b"F"
MAX_REQUEST = 1 << 20
FDS = 4
