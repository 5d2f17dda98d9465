"""The ``gpuhook`` command line: the root group and :func:`~gpuhook.cli.commands.run`
(:mod:`.commands`), one module per command group (:mod:`.cmd_setup`, :mod:`.cmd_inspect`,
:mod:`.cmd_runtime`, :mod:`.cmd_node`, :mod:`.cmd_mps`, :mod:`.cmd_check`) sharing
:mod:`.base`; the tables of ``inspect`` (:mod:`.tables`, the decisions: :mod:`.decisions`,
:mod:`.render`) and ``doctor`` (:mod:`.doctor` and its checks: :mod:`.doctor_node`,
:mod:`.doctor_engines`, :mod:`.doctor_host`, which import what a check is from
:mod:`.doctor_check`). Cold code: ordinary imports.

May import: everything.
"""
