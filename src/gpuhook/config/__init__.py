"""gpuhook's own configuration, one module per concept (docs/architecture.md, "Where each rule
lives"):

- :mod:`.types`: the frozen :class:`~gpuhook.config.types.Config` and its parts, and the names of
  the file and of gpuhook's environment variables;
- :mod:`.units`: sizes (``512M``, ``20G``) as the config and MPS write them;
- :mod:`.loading`: the file, read as YAML, checked against ``schemas/config.schema.json`` and by
  the rules a schema cannot state, with the defaults filled in;
- :mod:`.cache`: the validated JSON copy under ``/run/gpuhook/config`` that the create path
  reads, and the dispatcher's pointer file beside it, with the one rule both trust a file by.

- :mod:`.locate`: where the programs the config names are: the low-level runtime
  (``runtime.path``) and gpuhook's own programs (``hook.path``'s default); it imports nothing of
  gpuhook.

The pure core (:mod:`gpuhook.pipeline`) imports :mod:`.types` and :mod:`.units` only.

May import: gpuhook.model, the top-level modules. This ``__init__`` stays
empty of imports.
"""
