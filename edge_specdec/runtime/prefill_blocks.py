"""The KV blocks a long prompt's bf16 prefill copy writes, converted in place for the target and back.

The copy (session.py, "A long prompt's prefill in bf16") computes in bf16 and the CPU plugin keeps its cache in bf16,
while the target reads f16. Both take two bytes a value, so the copy's request reads and writes the session's own
block tensors seen as bf16 (`BlockPool.attach`), and when the target is to read what the copy wrote, those blocks are
converted to f16 where they lie (`to_target`): no second set of blocks. A later request that goes on prefilling on the
copy after such a prefix needs the copy's bits back (`to_copy`). f16 holds a bf16 value exactly from 2^-17 to its
largest binade, 2^15, and zero: smaller values lose mantissa bits in f16's subnormals and larger ones overflow, so
the conversion keeps those few aside, with where they were, and the way back puts them in again. The way there is the
conversion the target always read: widened to f32, then rounded to f16.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

# the bf16 bits (sign cleared) of the values f16 holds exactly, but zero: from the first on (2^-17; below it f16's
# subnormals drop mantissa bits) and under the second (2^16; from it on f16 overflows, and infinities and NaN)
EXACT_FROM, EXACT_TO = (127 - 17) << 7, (127 + 16) << 7


@dataclass
class KeptAside:
    """What converting a region of a session's blocks to f16 needs to convert them back: the tokens they held
    (`positions`) and, per cache input, the flat indices (in the region's blocks, in table order) and the bf16 bits of
    the values f16 does not hold exactly."""

    positions: int
    values: dict[str, tuple[np.ndarray, np.ndarray]]

    @property
    def count(self) -> int:
        """How many values are kept aside."""
        return sum(len(index) for index, _ in self.values.values())


def bf16_as_f16(bits: np.ndarray) -> np.ndarray:
    """bf16 values (their bits, uint16) as f16: widened to f32 (exact), then rounded to f16 (those past its range
    become infinities, as any cast to f16 makes them)."""
    with np.errstate(over="ignore"):
        return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float16)


def f16_as_bf16(values: np.ndarray) -> np.ndarray:
    """f16 values as bf16 bits (uint16): the upper half of their f32 bits, exact for every value that came from bf16
    and f16 holds exactly."""
    return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def inexact_in_f16(bits: np.ndarray) -> np.ndarray:
    """A mask of the bf16 values (bits, uint16) that f16 does not hold exactly."""
    magnitude = bits & np.uint16(0x7FFF)
    return (magnitude != 0) & ((magnitude < EXACT_FROM) | (magnitude >= EXACT_TO))


@lru_cache(maxsize=None)
def _tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each of the 65,536 bit patterns: read as bf16, its f16 bits and whether f16 holds it inexactly; read as
    f16, its bf16 bits (a lookup in tables this small is cheaper than the arithmetic on every value)."""
    every = np.arange(1 << 16, dtype=np.uint16)
    return bf16_as_f16(every).view(np.uint16), inexact_in_f16(every), f16_as_bf16(every.view(np.float16))


def _each_input(pool, threads: int, convert) -> list:
    """convert(name) for each of the pool's cache inputs, on `threads` threads (numpy's lookups let go of the GIL;
    the device's threads are idle meanwhile), holding the pool's lock: no call runs on the blocks meanwhile."""
    with pool.lock:
        if threads <= 1:
            return [convert(name) for name in pool.names]
        with ThreadPoolExecutor(threads) as workers:
            return list(workers.map(convert, pool.names))


def to_target(pool, table: list[int], positions: int, threads: int = 1) -> KeptAside:
    """Convert the bf16 values of the blocks that hold the first `positions` tokens of a block table to f16, in the
    pool's tensors (f16 arrays whose bits are bf16 there); returns what converting them back needs. Whole blocks: the
    slots past `positions` in the last one are rewritten before any call reads them."""
    as_f16, inexact, _ = _tables()
    index = np.asarray(table[:-(-positions // pool.block_size)], np.int64)

    def convert(name: str) -> tuple[np.ndarray, np.ndarray]:
        data = pool.tensors[name].data
        bits = data[index].view(np.uint16)
        odd = np.flatnonzero(np.take(inexact, bits))
        data[index] = np.take(as_f16, bits).view(np.float16)
        return odd, bits.reshape(-1)[odd]
    return KeptAside(positions, dict(zip(pool.names, _each_input(pool, threads, convert))))


def to_copy(pool, table: list[int], kept: KeptAside, positions: int, threads: int = 1) -> None:
    """Convert back to bf16 the blocks that hold the first `positions` tokens (at most kept.positions) of what
    `to_target` converted: the copy's own bits again, those kept aside among them."""
    if positions > kept.positions:
        raise ValueError(f"{positions} positions to convert back, of {kept.positions} converted")
    as_bf16 = _tables()[2]
    index = np.asarray(table[:-(-positions // pool.block_size)], np.int64)

    def convert(name: str) -> None:
        data = pool.tensors[name].data
        bits = np.take(as_bf16, data[index].view(np.uint16))
        odd, values = kept.values[name]
        inside = odd < bits.size
        bits.reshape(-1)[odd[inside]] = values[inside]
        data[index] = bits.view(np.float16)
    _each_input(pool, threads, convert)
