"""gpuhook's value types, by domain; frozen, slotted, cheap to import (the create path uses them).

- :mod:`.frozen`: the immutable base (the shim's argv parser imports it alone) and
  :mod:`.fields`, the typed readers of ``from_dict``;
- :mod:`.inventory`: the node (GPUs, MIG devices, device nodes, libraries);
- :mod:`.decision`: request channels, requests, device references, reasons, decisions;
- :mod:`.edits`: what gets injected (the CDI ``containerEdits`` shape);
- :mod:`.record`: a decision record as its readers see it (read once, checked, typed);
- :mod:`.check`: one line of ``doctor``'s and ``selftest``'s reports.

May import: nothing outside this package. This ``__init__`` stays empty of imports.
"""
