"""tools/fake-node's modules, one concept each: the fake hardware's device numbers and ids
(:mod:`.devices`), the driver's files (:mod:`.driver`), the truth a node is built from and written
to node.json (:mod:`.model`), the fake NVML's data (:mod:`.nvmldata`), compiling the C fakes and
stubs (:mod:`.build`), the file tree and device nodes (:mod:`.tree`), gpuhook's config for the node
(:mod:`.config`) and the command line (:mod:`.cli`). The C sources beside them; formats: README.md.
Stdlib only, Python 3.11.
"""

from __future__ import annotations

import os

SRC = os.path.dirname(os.path.abspath(__file__))  # the C sources
REPO = os.path.dirname(os.path.dirname(SRC))
GENERATOR = "tools/fake-node"


class Fail(Exception):
    """One line for the user; the tool exits 1."""
