"""The runtime shim and its hot path: what runs on every container create.

Owns: the runc argv grammar (:mod:`.runc_argv`), the build step that renders the sh dispatchers
from gpuhook's tables (:mod:`.dispatch`), OCI bundle I/O (:mod:`.ocispec`), the shim itself
(:mod:`.shim`), the real sources handed to the pipeline (:mod:`.decide`) and the OCI hooks
(:mod:`.hooks`).

May import: gpuhook.pipeline, gpuhook.records, gpuhook.mps, gpuhook.inventory, gpuhook.model,
the top-level modules.

Stdlib only and lazy imports: this ``__init__`` stays empty of imports.
"""
