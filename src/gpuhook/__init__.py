"""gpuhook: a node-local GPU sharing runtime.

This module is imported on the container-create hot path: keep it free of imports.
"""

__version__ = "0.1.0"
