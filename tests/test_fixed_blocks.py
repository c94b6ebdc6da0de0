"""Fixed block sizes (min_block): short blocks widened by re-feeding cached tokens; the output stays exact."""
from __future__ import annotations

import time

import numpy as np
import pytest

from edge_specdec.runtime import GenerationConfig, Pipeline
from edge_specdec.runtime.pipeline import DRAFT_BLOCK
from edge_specdec.runtime.probes import cheapest_step, fixed_block_pays
from edge_specdec.runtime.session import open_session
from support import EXACTNESS_PROMPTS, OTHER_VOCAB, SAME_VOCAB, load_target_xml, spy_block_sizes


@pytest.mark.parametrize("min_block", [3, 5, 9])
def test_widened_blocks_give_the_bits_of_single_steps(bundle_dir, min_block, monkeypatch):
    """Random blocks and rollbacks with min_block: the rows of one-token decoding, and no call shorter than
    min_block once the cache holds enough tokens."""
    session = open_session(load_target_xml(bundle_dir), rollback="paged", precision="dq")
    rng = np.random.default_rng(min_block)
    seq = rng.integers(0, 700, 80).tolist()
    ref = np.stack([session.feed([t])[0] for t in seq])
    session.reset()
    session.min_block = min_block
    sizes = spy_block_sizes(session, monkeypatch)
    session.feed(seq[:2])
    while session.length < len(seq):
        cur = session.length
        n = int(rng.integers(1, 4))
        fed = seq[cur:cur + n] + rng.integers(0, 700, int(rng.integers(0, 3))).tolist()  # then junk to reject
        wanted = int(rng.integers(1, 6))
        shortest = min(min_block, cur + len(fed))  # widening can only re-feed what the cache holds
        rows = session.feed(fed, rows=wanted)
        assert sizes[-1] >= shortest
        got = min(wanted, len(fed))
        assert len(rows) >= got
        for row, position in zip(rows[-got:], range(cur + len(fed) - got, cur + len(fed))):
            if position < cur + len(seq[cur:cur + n]):  # a real token's row: the bits of one-token decoding
                assert np.array_equal(row, ref[position])
        session.rollback(len(fed) - len(seq[cur:cur + n]))
    assert session.tokens == seq
    assert max(sizes[1:]) >= min_block  # the widening happened


def test_fixed_block_pays_measures_without_changing_the_session(bundle_dir):
    xml = load_target_xml(bundle_dir)
    paged = open_session(xml, rollback="paged")
    paged.feed([1, 2, 3])
    paged.min_block = 7
    assert isinstance(fixed_block_pays(paged, 5), bool)
    assert paged.min_block == 7 and paged.length == 0
    masked = open_session(xml, rollback="masked")
    assert fixed_block_pays(masked, 5) is False  # a masked session would keep every re-fed slot
    assert fixed_block_pays(paged, 1) is False


@pytest.fixture(scope="module")
def pipes(bundle_dir):
    return {(vocab, fixed): Pipeline(bundle_dir(*(SAME_VOCAB if vocab == "same" else OTHER_VOCAB)),
                                     fixed_blocks=fixed, static_shapes=False)
            for vocab in ("same", "hetero") for fixed in (True, False)}


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["standard", "prompt-lookup", "slem", "tli"])
def test_greedy_stays_lossless_with_and_without_fixed_blocks(pipes, algorithm, monkeypatch):
    vocab = "same" if algorithm in ("standard", "prompt-lookup") else "hetero"
    fixed, loose = pipes[vocab, True], pipes[vocab, False]
    k = 4
    target_sizes = spy_block_sizes(fixed.target, monkeypatch)
    draft_sizes = spy_block_sizes(fixed.draft, monkeypatch)
    for prompt in EXACTNESS_PROMPTS:
        config = GenerationConfig(max_new_tokens=20, ignore_eos=True)
        base = loose.generate(prompt, config, algorithm="none")
        del target_sizes[:], draft_sizes[:]
        for pipe in (fixed, loose):
            # the draft model drafts every round: a free copy's block has a length of its own
            spec = pipe.generate(prompt, config, algorithm=algorithm, num_assistant_tokens=k, confidence=0.0,
                                 lookup=False)
            assert spec.token_ids == base.token_ids, (algorithm, pipe.config.fixed_blocks, prompt)
        # the fixed pipeline's target verified in blocks of exactly k + 1 after the prompt (a proposal is cut to
        # k tokens, even where SLEM spells k draft tokens with more target tokens), but for a last round with room
        # for one token only, which drafts nothing and steps as the target alone; its draft stepped in blocks of
        # at least DRAFT_BLOCK
        alone = fixed.block_shapes(0, False)["target"]
        assert set(target_sizes[1:-1]) <= {k + 1} and target_sizes[-1] in (k + 1, alone)
        if algorithm != "prompt-lookup":
            assert min(draft_sizes[1:], default=DRAFT_BLOCK) >= DRAFT_BLOCK
    assert fixed.target.min_block == k + 1 and loose.target.min_block == 1


def test_the_target_alone_steps_in_its_cheapest_block(pipes, monkeypatch):
    pipe = pipes["same", True]
    sizes = spy_block_sizes(pipe.target, monkeypatch)
    config = GenerationConfig(max_new_tokens=8, ignore_eos=True)
    pipe.generate("def fib(n):", config, algorithm="none")  # the first call measures the cheapest step
    del sizes[:]
    pipe.generate("def fib(n):", config, algorithm="none")
    step = pipe.target.min_block
    assert step in (2, 3) and pipe.draft.min_block == 1  # an idle draft is left alone
    assert sizes[1:] == [step] * 7  # a block-invariant target re-feeds one or two tokens, no more


@pytest.mark.parametrize("cheaper, expected", [(3, 3), (2, 2)])
def test_cheapest_step_takes_the_faster_block(bundle_dir, monkeypatch, cheaper, expected):
    """A fake device on which blocks of `cheaper` tokens take 2 ms more and the other size 20 ms more: the faster
    wins (a gap well above what another worker's load makes a tiny model's call vary by)."""
    session = open_session(load_target_xml(bundle_dir))
    assert session.block_invariant
    infer = session._infer

    def paced(tokens, rows):
        time.sleep(0.002 if len(tokens) == cheaper else 0.020)
        return infer(tokens, rows)
    monkeypatch.setattr(session, "_infer", paced)
    session.min_block = 5
    assert cheapest_step(session) == expected
    assert session.min_block == 5 and session.length == 0  # measured on a scratch context, then left as it was


def test_a_masked_session_steps_in_its_least_block(bundle_dir):
    masked = open_session(load_target_xml(bundle_dir), rollback="masked")
    assert cheapest_step(masked) == 1
