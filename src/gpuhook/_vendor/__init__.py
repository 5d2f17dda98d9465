"""Third-party code shipped inside gpuhook, unmodified.

``pynvml.py``: the NVML bindings of nvidia-ml-py (BSD-3-Clause, NVIDIA Corporation; the license is
the file's header and debian/copyright repeats it). Debian 12 has no python3-pynvml, so the
.deb ships this copy; :mod:`gpuhook.inventory.nvml` imports a system ``pynvml`` first and falls
back to it. ``scripts/vendor-pynvml`` refreshes it from the release pinned in scripts/bootstrap.
"""

PYNVML_VERSION = "12.570.86"
PYNVML_SHA256 = "3c25b9a893e11ac86422121438e432517b3190255a3de4e2df447b2ec25be181"
