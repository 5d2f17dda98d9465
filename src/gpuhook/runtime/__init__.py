"""The runtime shim and its hot path: what runs on every container create.

The OCI runtime front end (docs/architecture.md, "Layers and front ends"): the C dispatcher, the
runtime service and the shim. Its one translation point is :func:`gpuhook.runtime.shim._decide`:
the bundle's ``config.json`` goes to :func:`gpuhook.runtime.decide.run`, where the core turns the
spec into its ``Request`` and its ``ContainerEdits`` into the new spec (``pipeline.request.parse``
and ``pipeline.apply.apply``: the OCI spec is the core's own shape), which the shim writes back.
:mod:`.decide`, :mod:`.ocispec` and :mod:`.imagefs` are sources every front end may use; no other
module here may be imported by another front end.

Owns: the runc argv grammar (:mod:`.runc_argv`), the build step that makes the dispatchers from
gpuhook's tables (:mod:`.dispatch`: the compiled gpuhook-runtime, the sh gpuhook), OCI bundle I/O
(:mod:`.ocispec`), the shim itself (:mod:`.shim`), the runtime service that runs the shim's
decisions without an interpreter start per container (:mod:`.service`; its protocol with the
C dispatcher: :mod:`.wire`; whom it serves: :mod:`.peer`; its worker pool: :mod:`.pool`; the
pages a worker copies ahead: :mod:`.prefault`; becoming the caller: :mod:`.adopt`), the real
sources handed to the pipeline (:mod:`.decide`), the OCI hooks (:mod:`.hooks`; the ld.so.cache
merge :mod:`.ldmerge`) and reading or writing inside a container's rootfs without following its
links out of it (:mod:`.imagefs`).

May import: gpuhook.pipeline, gpuhook.records, gpuhook.mps, gpuhook.inventory, gpuhook.config,
gpuhook.model, the top-level modules.

Stdlib only and lazy imports: this ``__init__`` stays empty of imports.
"""
