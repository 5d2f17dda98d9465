"""Decision records: one JSON file per create, and finding them again.

Owns: building and writing records (:mod:`.writer`, the one record writer), lookup by id or
prefix and listing (:mod:`.lookup`, which reads each record once into
:class:`gpuhook.model.record.Record`, the model every reader uses; what the live MPS records
reserve is :mod:`gpuhook.mps.admission`'s), the folder's automatic upkeep (:mod:`.sweep`:
links removed on delete, swept once they dangle), gc of the links of deleted containers the
runtime must judge (:mod:`.gc`),
the exec-env markers of containers whose grant carries environment (:mod:`.execenv`), and the
container-id rule both name files by, with the record link's name (:mod:`.ids`).

May import: gpuhook.pipeline, gpuhook.config, gpuhook.model, the top-level modules.
"""
