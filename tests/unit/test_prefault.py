"""The runtime service's learned prefault, its pure side: which mappings count, which pagemap
entries are pages a worker wrote, and the runs of pages a new worker copies; and a learned union
made from real reports of this process's own pagemap."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest

from gpuhook.runtime import prefault

PAGE = 4096
SRC = Path(__file__).resolve().parents[2] / "src"


def entry(present: bool, exclusive: bool) -> bytes:
    return struct.pack("<Q", (present << 63) | (exclusive << 56) | 0x1234)


def test_only_private_writable_mappings_count() -> None:
    maps = (
        "00400000-00421000 r--p 00000000 fe:00 1 /usr/bin/python3.11\n"
        "00a00000-00a10000 rw-p 00600000 fe:00 1 /usr/bin/python3.11\n"
        "01000000-01200000 rw-p 00000000 00:00 0 [heap]\n"
        "7f0000000000-7f0000010000 rw-s 00000000 00:01 7 /dev/shm/x\n"
        "7f0000100000-7f0000101000 r-xp 00000000 fe:00 2 /usr/lib/libc.so.6\n"
        "7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]\n"
    )
    assert prefault.writable_ranges(maps) == [
        (0x00A00000, 0x00A10000),
        (0x01000000, 0x01200000),
        (0x7FFD00000000, 0x7FFD00021000),
    ]


def test_a_written_page_is_present_and_mapped_by_the_worker_alone() -> None:
    entries = entry(True, True) + entry(True, False) + entry(False, True) + entry(False, False)
    assert prefault.written_flags(entries) == b"1000"


def test_runs_of_written_pages_per_mapping() -> None:
    ranges = [(0x1000, 0x5000), (0x10000, 0x13000)]  # 4 pages, then 3
    assert prefault.runs(ranges, "0110" + "111", PAGE) == [(0x2000, 2 * PAGE), (0x10000, 3 * PAGE)]
    assert prefault.runs(ranges, "1001" + "010", PAGE) == [
        (0x1000, PAGE),
        (0x4000, PAGE),
        (0x11000, PAGE),
    ]
    assert prefault.runs(ranges, "0000000", PAGE) == []


LEARN = """
import sys
sys.path.insert(0, sys.argv[1])
from gpuhook.runtime import prefault
learned = prefault.Learned()
learned.fork_next()
learned.report()
learned.take()
runs, ranges = learned.runs, learned.ranges
inside = all(any(lo <= a and a + n <= hi for lo, hi in ranges) for a, n in runs)
print(learned.reporting, len(runs) > 0, inside, all(n % learned.page == 0 for _, n in runs))
learned.copy()
"""


def test_a_report_is_learned_as_runs_of_written_pages_in_the_service_ranges() -> None:
    """A small process as the service is (python3 -I -S): its own report, taken back."""
    if prefault.populate_write() is None:
        pytest.skip("this kernel has no MADV_POPULATE_WRITE: nothing is learned")
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", LEARN, str(SRC)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == "True True True True\n"


def test_workers_after_the_first_report_one_in_every() -> None:
    learned = prefault.Learned()
    reporting = []
    for _ in range(prefault.REPORT_FIRST + 2 * prefault.REPORT_EVERY):
        learned.fork_next()
        reporting.append(learned.reporting)
    first = prefault.REPORT_FIRST
    assert reporting[:first] == [True] * first
    assert sum(reporting[first:]) == 2
