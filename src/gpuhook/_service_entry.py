"""Exec'ed by ``gpuhook runtime serve`` as ``python3 -I -S <this file> FD SOCKET DEV:INO [CONFIG]``.

The runtime service's own process (:func:`gpuhook.runtime.service.main`): an interpreter that
imports only what a create needs before it forks its workers, never the CLI's click, yaml or
jsonschema. The folder that holds the gpuhook package is derived from this file's own path.
"""

import sys

sys.path.insert(0, __file__.rpartition("/")[0].rpartition("/")[0] or "/")

from gpuhook.runtime.service import main

sys.exit(main(sys.argv[1:]))
