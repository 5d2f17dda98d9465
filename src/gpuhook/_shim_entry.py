"""Started by the gpuhook-runtime dispatcher as ``python3 -I -S <this file> ARGS``.

``-I`` ignores the environment (PYTHONPATH, PYTHONHOME, user site) and ``-S`` skips the
site-packages scan, so a container start pays only for the interpreter. The folder that holds the
gpuhook package is derived from this file's own path. A create whose spec cannot request a GPU
is done by :mod:`gpuhook.runtime.fastpath` (built-in modules only); everything else by the shim.
"""

import sys

sys.path.insert(0, __file__.rpartition("/")[0].rpartition("/")[0] or "/")

from gpuhook.runtime import fastpath

fastpath.create(sys.argv)  # a create without GPU markers: execs the runtime, never returns

from gpuhook.runtime.shim import main  # noqa: E402 - everything else

sys.exit(main(sys.argv))
