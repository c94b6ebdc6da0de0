"""A long prompt's bf16 prefill copy writes the target's own f16 blocks (prefill_blocks.py): converted in place for the
target, the values are what a cast of the copy's bf16 values to f16 gives, and converted back, the copy's own bits,
the values f16 cannot hold (tiny, huge, infinities, NaN) among them."""
from __future__ import annotations

import numpy as np
import pytest

from edge_specdec.runtime.prefill_blocks import bf16_as_f16, inexact_in_f16, to_copy, to_target

BLOCK = 4  # tokens a block holds


class Pool:
    """The parts of a BlockPool the conversion reads: f16 block tensors [blocks, heads, tokens, head size]."""

    def __init__(self, data: dict[str, np.ndarray]):
        import threading
        self.names, self.block_size, self.lock = list(data), BLOCK, threading.RLock()
        self.tensors = {name: type("T", (), {"data": array})() for name, array in data.items()}


def bf16_bits(values) -> np.ndarray:
    """bf16 bits of float32 values, truncated (what numpy cannot cast to: bf16 has no numpy type)."""
    return (np.asarray(values, np.float32).view(np.uint32) >> 16).astype(np.uint16)


# bf16 values at f16's edges: zeros, the smallest it holds exactly and the next below, its subnormals, its largest
# binade and the next above, infinities, NaN, bf16 subnormals, ordinary values
EDGES = np.concatenate([
    bf16_bits([0.0, -0.0, 2.0 ** -17, -(2.0 ** -17) * 1.5, 2.0 ** -18, 2.0 ** -17 * 1.9921875, 2.0 ** -14 * 1.5,
               65280.0, -65280.0, 65536.0, 2.0 ** 100, np.inf, -np.inf, 1.0, -3.140625, 1e-30]),
    np.asarray([0x7FC1, 0x0001, 0x8003], np.uint16)])  # a NaN with a payload, two bf16 subnormals


def test_every_value_f16_does_not_hold_is_kept_aside_and_only_those_outside_its_exact_range():
    """Against a round trip through f16, value by value, over all 65,536 bf16 bit patterns: every value that does not
    come back is flagged; a flagged value lies outside 2^-17 to 2^16 (some of those come back, having few mantissa
    bits: keeping them aside too costs nothing) and is not zero."""
    everything = np.arange(1 << 16, dtype=np.uint16)
    wide = (everything.astype(np.uint32) << 16).view(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        back = bf16_bits(wide.astype(np.float16).astype(np.float32))
    flagged = inexact_in_f16(everything)
    assert not (back != everything)[~flagged].any()
    magnitude = np.abs(wide[flagged])
    assert ((magnitude < 2.0 ** -17) | ~(magnitude < 2.0 ** 16)).all() and (everything[flagged] & 0x7FFF).all()
    assert flagged[bf16_bits([2.0 ** -18, 1e-30, 65536.0, np.inf])].all()


@pytest.mark.parametrize("threads", [1, 3])
def test_the_target_reads_the_f16_cast_and_the_copy_gets_its_bits_back(threads):
    rng = np.random.default_rng(0)
    shape = (5, 2, BLOCK, 8)  # 5 blocks in the pool, 2 heads, head size 8
    written = {name: bf16_bits(rng.standard_normal(shape) * scale)
               for name, scale in (("key_cache.0", 1.0), ("value_cache.0", 1e-4))}
    for bits in written.values():
        bits[3].reshape(-1)[:len(EDGES)] = EDGES  # in the first block of the table below
    table = [3, 1, 4]  # the session's blocks, not in the pool's order: 3 blocks hold 10 tokens
    pool = Pool({name: bits.copy().view(np.float16) for name, bits in written.items()})
    kept = to_target(pool, table, 10, threads)
    assert kept.count >= 2 * 10  # the edges' inexact values in each tensor, the tiny values of the second
    for name, bits in written.items():
        data = pool.tensors[name].data
        with np.errstate(over="ignore"):
            cast = (bits[table].astype(np.uint32) << 16).view(np.float32).astype(np.float16)
        assert np.array_equal(data[table].view(np.uint16), cast.view(np.uint16))
        assert np.array_equal(data[[0, 2]].view(np.uint16), bits[[0, 2]])  # other sessions' blocks untouched
    to_copy(pool, table, kept, 10, threads)
    for name, bits in written.items():
        assert np.array_equal(pool.tensors[name].data.view(np.uint16), bits)


def test_the_copy_gets_back_only_the_blocks_of_the_tokens_it_goes_on_after():
    rng = np.random.default_rng(1)
    written = bf16_bits(rng.standard_normal((4, 1, BLOCK, 2)) * 1e-5)
    pool = Pool({"key_cache.0": written.copy().view(np.float16)})
    kept = to_target(pool, [0, 1, 2], 9)
    converted = pool.tensors["key_cache.0"].data.view(np.uint16).copy()
    to_copy(pool, [0, 1, 2], kept, 5)  # blocks 0 and 1
    now = pool.tensors["key_cache.0"].data.view(np.uint16)
    assert np.array_equal(now[:2], written[:2]) and np.array_equal(now[2:], converted[2:])
    with pytest.raises(ValueError, match="of 9 converted"):
        to_copy(pool, [0, 1, 2], kept, 10)


def test_the_cast_rounds_to_nearest_even_and_overflows_to_infinity():
    """f16's subnormals are 2^-24 apart: 2^-20 + 2^-27 rounds down to 2^-20, 1.5 x 2^-24 (halfway) to the even 2^-23."""
    values = bf16_as_f16(bf16_bits([2.0 ** -20 + 2.0 ** -27, 1.5 * 2.0 ** -24, -1.5 * 2.0 ** -24, 65536.0]))
    assert values.tolist() == [2.0 ** -20, 2.0 ** -23, -(2.0 ** -23), np.inf]
