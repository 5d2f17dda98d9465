"""The service's pages a runtime service worker copies before it takes a call: those that earlier
workers wrote.

A worker is a fork of the service, so every page of the service's memory is shared with it until
it writes one, and the first write to each stops the worker for a page fault that copies the
page. Python writes an object whenever it uses one (its reference count), so a 1-GPU create takes
~600 such faults, ~1.5 ms on the project's reference machine, half of the worker's time. They are
mostly the same pages every time. So a worker (the first :data:`REPORT_FIRST`, then one in
:data:`REPORT_EVERY`), once it has replied, reports which of the service's pages it wrote (the
ones its ``/proc/self/pagemap`` shows mapped by it alone), and the service keeps their union
(:class:`Learned`); a new worker copies those pages, one ``madvise(MADV_POPULATE_WRITE)`` per run
of them, right after it is forked, while it waits for a call (:meth:`Learned.copy`). Nothing
changes what a worker computes: the copies hold what the shared pages held. Where the kernel
lacks ``MADV_POPULATE_WRITE`` (before Linux 5.14) or the service cannot read its pagemap, nothing
is learned or copied and workers fault as before.

Stdlib only (:mod:`ctypes` for ``madvise``, loaded by the service before it forks).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

MADV_POPULATE_WRITE = 23  # linux/mman.h, since 5.14
PAGEMAP = "/proc/self/pagemap"
PIPE_BUF = 4096  # a report is one atomic pipe write: a bitmap of at most this many bytes
# Which workers report (reading the pagemap costs ~0.5 ms after the reply): the first ones, then
# one in REPORT_EVERY, so that paths first taken later (another request kind) are learned too.
REPORT_FIRST = 16
REPORT_EVERY = 32
# A pagemap entry's top byte: bit 63 (0x80) the page is present, bit 56 (0x01) only this process
# maps it (a page it wrote since the fork, or first touched).
_WRITTEN = bytes(b"1"[0] if v & 0x81 == 0x81 else b"0"[0] for v in range(256))


def writable_ranges(maps: str) -> list[tuple[int, int]]:
    """The private writable mappings of ``/proc/<pid>/maps`` text: (start, end) addresses."""
    out = []
    for line in maps.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[1].startswith("rw") and fields[1][3:4] == "p":
            start, _, end = fields[0].partition("-")
            out.append((int(start, 16), int(end, 16)))
    return out


def written_flags(entries: bytes) -> bytes:
    """One ``b"1"`` (written: present, mapped by this process alone) or ``b"0"`` per 8-byte
    little-endian pagemap entry of ``entries``."""
    return entries[7::8].translate(_WRITTEN)


def runs(ranges: list[tuple[int, int]], flags: str, page: int) -> list[tuple[int, int]]:
    """The (address, length) runs of consecutive pages whose flag in ``flags`` (one character
    per page of ``ranges``, in order) is ``"1"``."""
    out = []
    first = 0
    for start, end in ranges:
        count = (end - start) // page
        part = flags[first : first + count]
        at = part.find("1")
        while at >= 0:
            stop = part.find("0", at)
            stop = count if stop < 0 else stop
            out.append((start + at * page, (stop - at) * page))
            at = part.find("1", stop)
        first += count
    return out


class Learned:
    """The union of the pages the workers reported (in the service), what a worker copies and
    reports (in a worker). Made in the service before it forks any worker."""

    def __init__(self) -> None:
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.ranges: list[tuple[int, int]] = []
        self.bits = 0
        self.size = 0  # bytes of a report: one bit per page of ranges
        self.runs: list[tuple[int, int]] = []
        self.forked = 0
        self.reporting = False  # whether the worker about to be forked reports
        self.read_fd = self.write_fd = -1
        self._madvise = populate_write()
        if self._madvise is None:
            return
        try:
            with open("/proc/self/maps") as fh:
                ranges = writable_ranges(fh.read())
            os.close(os.open(PAGEMAP, os.O_RDONLY | os.O_CLOEXEC))
        except OSError:
            return
        pages = sum((end - start) // self.page for start, end in ranges)
        if not pages or pages > 8 * PIPE_BUF:  # a report: one atomic write of a bitmap
            return
        self.ranges = ranges
        self.size = (pages + 7) // 8
        self.read_fd, self.write_fd = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(self.write_fd, False)  # a worker's report never waits: it is dropped

    def fork_next(self) -> None:
        """(service) Before a worker is forked: whether it reports (:attr:`reporting`)."""
        self.reporting = self.forked < REPORT_FIRST or self.forked % REPORT_EVERY == 0
        self.forked += 1

    def take(self) -> None:
        """(service) Add the reports waiting on :attr:`read_fd` to the union."""
        data = os.read(self.read_fd, 64 * PIPE_BUF)
        bits = self.bits
        for at in range(0, len(data) - self.size + 1, self.size):
            bits |= int.from_bytes(data[at : at + self.size], "little")
        if bits != self.bits:
            self.bits = bits
            flags = f"{bits:0{self.size * 8}b}"[::-1]  # page i is bit i
            self.runs = runs(self.ranges, flags, self.page)

    def copy(self) -> None:
        """(worker) Copy the learned pages now (each run in one call)."""
        if self._madvise is None:
            return
        for start, length in self.runs:
            self._madvise(start, length, MADV_POPULATE_WRITE)  # a run unmapped since: no copy

    def report(self) -> None:
        """(worker) Tell the service which of its pages this worker wrote; never raises."""
        if self.write_fd < 0 or not self.reporting:
            return
        page = self.page
        try:
            fd = os.open(PAGEMAP, os.O_RDONLY | os.O_CLOEXEC)
            try:
                flags = b"".join(
                    written_flags(os.pread(fd, (end - start) // page * 8, start // page * 8))
                    for start, end in self.ranges
                )
            finally:
                os.close(fd)
            bits = int(flags[::-1], 2) if flags else 0
            os.write(self.write_fd, bits.to_bytes(self.size, "little"))
        except (OSError, ValueError, OverflowError):
            pass


def populate_write() -> Callable[[int, int, int], int] | None:
    """libc's ``madvise`` when the kernel has ``MADV_POPULATE_WRITE``, else None."""
    import ctypes
    import mmap

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    madvise.restype = ctypes.c_int
    probe = mmap.mmap(-1, mmap.PAGESIZE)
    try:
        view = ctypes.c_char.from_buffer(probe)
        supported = madvise(ctypes.addressof(view), mmap.PAGESIZE, MADV_POPULATE_WRITE) == 0
        del view
    finally:
        probe.close()
    return madvise if supported else None
