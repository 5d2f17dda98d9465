"""Started by the ``gpuhook`` dispatcher as ``python3 -I -S <this file> ARGS``.

``gpuhook hook ...`` (run by the container runtime on container creation) stays on the standard
library; every other command turns on site-packages and runs the click CLI.
"""

import sys

sys.path.insert(0, __file__.rpartition("/")[0].rpartition("/")[0] or "/")

from gpuhook.__main__ import main

sys.exit(main(sys.argv))
