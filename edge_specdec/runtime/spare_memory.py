"""Memory the process holds but no longer needs, given back to the system: the pages of a model's weights file that
its compiled model has stopped reading, and the free memory of the heap after a measurement's large KV cache.

Weights pages (`release_mapped`): OpenVINO reads a model's weights by mapping its .bin file into memory
(`Core.read_model` on a path, ENABLE_MMAP by default), and the compiled model keeps that mapping: its constants point
into it. On its first inference the CPU plugin repacks each weight into a layout of its own, in memory of the
process, and from then on computes with the repacked copy; the mapped pages it read to repack stay resident in the
process all the same, about the size of the weights file again (the 1.5B int4 target's 1.1 GB file: 0.9 GiB of
resident pages beside its repacked weights). They are clean pages of a read-only mapping of a file, so telling the
kernel that the process does not need them now (madvise MADV_DONTNEED) drops them from the process without
changing a byte it can read: a page read again (a row the embedding's Gather looks up) is read back from the file,
as after any eviction. Mappings that could hold written pages (writable ones, and private ones that hold copies of
written pages) are left alone. Around a model's
first inference (`releasing_mapped`) the pages go back as the device reads them, so that the load's peak does not
hold the file and the repacked weights at once either.

The heap (`trim_heap`): a KV cache's tensors are allocated one per layer and cache input, a few MiB each, which the C
library serves from its heap once earlier large blocks were freed; freed, they stay in the heap, resident, until
something asks it to give its free pages back (glibc's malloc_trim). The block-invariance probe's past of
probes.LONG_PAST tokens (224 MiB of f16 KV for the 1.5B target) would otherwise stay resident after the probe.

Linux only (/proc/self/maps, madvise, glibc's malloc_trim); elsewhere nothing is done.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import sys
import threading
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Iterator, Optional, Union

MAPS, SMAPS = Path("/proc/self/maps"), Path("/proc/self/smaps")


def mappings(path: Union[str, Path]) -> list[tuple[int, int, str]]:
    """This process's mappings of the file `path`: (start, end, permissions) each; [] where /proc is absent."""
    wanted = os.path.realpath(path)
    try:
        lines = MAPS.read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        fields = line.split(maxsplit=5)  # address, permissions, offset, device, inode, path (which may hold spaces)
        if len(fields) == 6 and fields[5] == wanted:
            start, end = (int(x, 16) for x in fields[0].split("-"))
            found.append((start, end, fields[1]))
    return found


def _holding_copies() -> Optional[set[int]]:
    """The start addresses of this process's mappings that hold anonymous pages (private copies of written pages),
    from /proc/self/smaps; None where it cannot be read."""
    held, start = set(), None
    try:
        with open(SMAPS) as f:
            for line in f:
                key, _, rest = line.partition(" ")
                if "-" in key and not key.endswith(":"):  # a mapping's header line
                    start = int(key.split("-")[0], 16)
                elif key == "Anonymous:" and int(rest.split()[0]) > 0:
                    held.add(start)
    except (OSError, ValueError):
        return None
    return held


@lru_cache(maxsize=None)
def _libc(name: str, argtypes: tuple, restype):
    """The C library's function `name` with its signature, or None where it cannot be called (not Linux, not in
    this libc)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    function.argtypes, function.restype = list(argtypes), restype
    return function


def _madvise():
    if not hasattr(mmap, "MADV_DONTNEED"):
        return None
    return _libc("madvise", (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int), ctypes.c_int)


def release_mapped(path: Optional[Union[str, Path]]) -> int:
    """Drop from this process the resident pages of its read-only mappings of the file `path` (see "Weights pages"
    above); the bytes of the mappings advised, 0 where there are none or nothing can be done. Call it once the
    model that maps the file has run its first inference: pages it has not read yet would only be read again."""
    madvise = _madvise()
    if path is None or madvise is None:
        return 0
    advised, found = 0, mappings(path)
    # a private mapping may hold copies of pages written (before it became read-only): those differ from the file
    copies = _holding_copies() if any(p[3:4] != "s" for _, _, p in found) else set()
    for start, end, permissions in found:
        if "w" in permissions or (permissions[3:4] != "s" and (copies is None or start in copies)):
            continue
        if madvise(start, end - start, mmap.MADV_DONTNEED) == 0:
            advised += end - start
    return advised


def trim_heap() -> bool:
    """Give the heap's free pages back to the system (see "The heap" above); whether it could be asked."""
    trim = _libc("malloc_trim", (ctypes.c_size_t,), ctypes.c_int)
    if trim is None:
        return False
    trim(0)
    return True


@contextmanager
def releasing_mapped(path: Optional[Union[str, Path]], interval: float = 0.05) -> Iterator[None]:
    """Within the block, give back the mapped pages of the file `path` every `interval` seconds (from a thread of
    its own) and once more at its end: around a model's first inference, in which the device reads every weight
    once to repack it, so that the pages it has read and the repacked copies are never resident at once. A page
    dropped while the device still reads it is read back from the file (see "Weights pages" above)."""
    if path is None or _madvise() is None:  # nothing to give back here
        yield
        return
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval):
            release_mapped(path)
    thread = threading.Thread(target=loop, name="release-pages", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        release_mapped(path)
