"""Turn on site-packages lazily.

The runtime shim is started as ``python3 -I -S`` so that a container start pays for no
site-packages scan and no ``.pth`` files. Only the rare paths that need a third-party module
(config compilation needs yaml/jsonschema, an inventory refresh needs pynvml) call
:func:`enable_site_packages` first. In a normal interpreter this is a no-op.
"""

from __future__ import annotations

import sys

_done = False


def enable_site_packages() -> None:
    global _done
    if _done or not sys.flags.no_site:
        return
    _done = True
    import site

    site.main()
