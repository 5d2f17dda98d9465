"""Started by the gpuhook-runtime dispatcher as ``python3 -I -S <this file> ARGS``.

``-I`` ignores the environment (PYTHONPATH, PYTHONHOME, user site) and ``-S`` skips the
site-packages scan, so a container start pays only for the interpreter. The folder that holds the
gpuhook package is derived from this file's own path. The dispatcher itself (compiled C) passes
creates without any GPU marker to the runtime; what reaches Python, :mod:`gpuhook.runtime.shim`
decides.
"""

import sys

sys.path.insert(0, __file__.rpartition("/")[0].rpartition("/")[0] or "/")

from gpuhook.runtime.shim import main

sys.exit(main(sys.argv))
