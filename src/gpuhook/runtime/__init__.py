"""The runtime shim and its hot path: what runs on every container create.

Owns: the runc argv grammar (:mod:`.runc_argv`), the build step that makes the dispatchers from
gpuhook's tables (:mod:`.dispatch`: the compiled gpuhook-runtime, the sh gpuhook), where the
low-level runtime and gpuhook's own programs are (:mod:`.locate`), OCI bundle I/O
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
