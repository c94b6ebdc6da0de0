"""The call layouts of an exact session on 1, 2 and more threads than this machine's cores: block-invariant on
each, after a past beyond 1024 tokens too, the one-token-sequences layout too, and the same rows whatever the
thread count (the attention kernels split their work by threads; a split that changed a sum's order would change
the bits). OpenVINO caps a request for more threads than cores at the cores it has: that entry checks the capped
setting."""
from __future__ import annotations

import os

import numpy as np
import pytest

from edge_specdec.runtime.session import open_model
from support import load_target_xml

pytestmark = pytest.mark.slow  # three compiles, each probed at long pasts

PAST = 1100  # beyond 1024 tokens: several KV blocks per attention work item
BLOCK = [5, 6, 7, 8, 9]


@pytest.fixture(scope="module")
def rows_by_threads(bundle_dir):
    """threads -> (the model's reported threads, whether it passed the probe at dq, a block's rows, the same
    tokens' rows fed in pieces) after a PAST-token prompt. The probe runs in open_model: no verdict is given to it."""
    xml = load_target_xml(bundle_dir)
    prompt = np.random.default_rng(3).integers(0, 64, PAST).tolist()
    found = {}
    for threads in (1, 2, 2 * (os.cpu_count() or 1)):
        model = open_model(xml, config={"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads},
                           known_invariant={})
        session = model.session()
        passes = model.block_invariant and model.precision == "dq"
        session.feed(prompt, rows=1)
        block = session.feed(BLOCK, rows=len(BLOCK))
        session.rollback(len(BLOCK))
        # a lone token is re-fed with the one before it: three calls of 2, 2 and 3 tokens
        pieces = np.concatenate([session.feed(BLOCK[:2]), session.feed(BLOCK[2:3]), session.feed(BLOCK[3:])])
        # the one-token-sequences layout after the prompt (session.py): one call of the block, then calls of 1, 1
        # and 3 tokens, whose pad sequences depend on the thread count
        session.rollback(len(BLOCK))
        session.sequences_from = PAST
        sequences = session.feed(BLOCK, rows=len(BLOCK))
        session.rollback(len(BLOCK))
        sequence_pieces = np.concatenate([session.feed(BLOCK[:1]), session.feed(BLOCK[1:2]), session.feed(BLOCK[2:])])
        found[threads] = (model.compiled.get_property("INFERENCE_NUM_THREADS"), passes, block, pieces[-len(BLOCK):],
                          sequences, sequence_pieces)
    return found


def test_each_thread_count_is_block_invariant_after_a_long_past(rows_by_threads):
    for threads, (_, passes, block, pieces, _, _) in rows_by_threads.items():
        assert passes, f"the probe failed on {threads} threads"
        assert np.array_equal(block, pieces), f"a block's rows differ from its pieces' on {threads} threads"


def test_the_rows_do_not_depend_on_the_thread_count(rows_by_threads):
    reported = {threads: got[0] for threads, got in rows_by_threads.items()}
    assert reported[1] == 1 and reported[2] == 2, reported  # the setting reached the compiled model
    one = rows_by_threads[1][2]
    for threads, (_, _, block, _, _, _) in rows_by_threads.items():
        assert np.array_equal(one, block), f"{threads} threads gave other bits than 1 thread"


def test_the_sequences_layout_gives_the_same_rows_on_every_thread_count(rows_by_threads):
    """After a prompt of PAST tokens, tokens fed as one-token sequences: one call of the block or calls of 1, 1 and
    3 tokens (other numbers of pad sequences), on 1, 2 and more threads, give the same rows, bit for bit."""
    one = rows_by_threads[1][4]
    assert not np.array_equal(one, rows_by_threads[1][2])  # another layout than the block's: other bits
    for threads, (_, _, _, _, sequences, pieces) in rows_by_threads.items():
        assert np.array_equal(sequences, pieces), f"calls of other sizes differ on {threads} threads"
        assert np.array_equal(one, sequences), f"{threads} threads gave other bits than 1 thread"
