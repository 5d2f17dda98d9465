"""Container engine registration: docker, containerd, podman.

Owns: the pure config edits, one module per engine (:mod:`.docker`, :mod:`.containerd` with
:mod:`.containerd_toml` and :mod:`.containerd_dropin`, :mod:`.podman`) with what they share in
:mod:`.common`, gathered in :mod:`.registration`; the
file side of ``gpuhook runtime configure|unconfigure`` (:mod:`.configure`), the table of engines
(names, default configs, services, daemons) and the read-only views of their configs that doctor
and the maintainer scripts use (:mod:`.readers`), the Debian maintainer-script checks
(:mod:`.maintscript`), and the CDI spec that engines resolving CDI themselves read (:mod:`.cdi`).

May import: gpuhook.pipeline (the CDI export reuses its edits), gpuhook.inventory,
gpuhook.config, gpuhook.model, the top-level modules.
"""
