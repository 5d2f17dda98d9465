"""The ``gpuhook`` command line: click commands (:mod:`.commands`, the only click import), the
tables of ``inspect`` (:mod:`.tables`, the decisions: :mod:`.decisions`, :mod:`.render`) and
``doctor`` (:mod:`.doctor`).

May import: everything.
"""
