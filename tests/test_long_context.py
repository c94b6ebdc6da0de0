"""Exactness with a long context: the block-invariance probe after a long past (cheap: `fill_past` copies a short
prefill's KV blocks along the cache), the check a target must pass at load, and speculative runs on prompts
near the tiny models' context of 512 tokens that give the target alone's token ids and logprob bits."""
from __future__ import annotations

import numpy as np
import pytest

import edge_specdec.runtime.session as session_module
from edge_specdec.runtime import GenerationConfig, Pipeline
from edge_specdec.runtime.probes import LONG_PAST, REAL_PAST, fill_past, is_block_invariant, passes_block_invariance
from edge_specdec.runtime.session import open_model
from hostile_text import HOSTILE_STRINGS
from support import OTHER_VOCAB, SAME_VOCAB, load_target_xml

LONG_TEXT = "\n".join(s for s in HOSTILE_STRINGS if s.strip()) + "\ndef parse(line):\n    return line.split(',')\n"


def test_fill_past_gives_a_long_context_whose_last_block_is_real(bundle_dir):
    model = open_model(load_target_xml(bundle_dir), known_invariant={"dq": True})
    session = model.session()
    fill_past(session, 300)
    block = session.block_size
    assert session.length == 300 // block * block and session.length > 4 * block
    assert is_block_invariant(session, past=300) and session.length == 0
    # the last block was computed for real: re-feeding its last token (as a lone step does) rewrites the same values
    fill_past(session, 300)
    tokens = [7, 8, 9]
    whole = session.feed(tokens)
    session.rollback(3)
    steps = np.concatenate([session.feed([t]) for t in tokens])
    assert np.array_equal(whole, steps)


class _DriftingSession:
    """A fake session whose logits change in the last bits once its context is longer than `beyond` and a call
    has fewer than 3 tokens, as a kernel that takes another path for a long past would."""

    def __init__(self, beyond: int):
        self.beyond, self.vocab_size, self.max_context, self.static_sizes, self.tokens = beyond, 50, None, (), []

    @property
    def length(self):
        return len(self.tokens)

    def reset(self):
        self.tokens = []

    def rollback(self, n):
        del self.tokens[-n:]

    def feed(self, tokens, rows=None):
        out = []
        for token in tokens:
            self.tokens.append(token)
            out.append(np.full(self.vocab_size, float(sum(self.tokens) % 97), np.float32))
        out = np.stack(out)
        if self.length > self.beyond and len(tokens) < 3:
            out = out + np.float32(1e-3)
        return out[-(rows or len(tokens)):]


def test_the_long_probe_catches_a_kernel_that_drifts_only_at_a_long_past():
    session = _DriftingSession(beyond=1000)
    assert is_block_invariant(session)
    assert not is_block_invariant(session, past=2000)
    assert not passes_block_invariance(session)
    assert passes_block_invariance(_DriftingSession(beyond=LONG_PAST * 2))


def test_open_model_checks_the_long_past_once_and_keeps_the_answer(bundle_dir, monkeypatch):
    pasts = []
    probe = session_module.passes_block_invariance.__globals__["is_block_invariant"]

    def spy(session, past=0, copy=True):
        pasts.append(past)
        return probe(session, past, copy)
    monkeypatch.setitem(session_module.passes_block_invariance.__globals__, "is_block_invariant", spy)
    known, longest = {}, {}
    model = open_model(load_target_xml(bundle_dir), known_invariant=known, known_longest=longest)
    assert model.block_invariant and known == {"dq": True}
    assert pasts == [0, REAL_PAST, LONG_PAST]  # capped to the tiny model's context inside the probe
    open_model(load_target_xml(bundle_dir), known_invariant=known, known_longest=longest)
    assert pasts == [0, REAL_PAST, LONG_PAST]  # the answer came from `known` (the measurement cache), not measured again


@pytest.mark.parametrize("pair, algorithms", [(SAME_VOCAB, ["standard", "prompt-lookup"]),
                                              pytest.param(OTHER_VOCAB, ["slem", "tli"], marks=pytest.mark.slow)])
def test_long_prompts_are_exact(cache_off_pipes, pair, algorithms):
    """A prompt of about 400 tokens (the tiny models' context is 512), 48 new tokens: every algorithm gives the
    target alone's ids and logprob bits, and so does a second run whose prompt extends the first (prefix reuse)."""
    pipe = cache_off_pipes(pair)
    ids = pipe.tokenizer.encode(LONG_TEXT * 8)[:400]
    assert len(ids) == 400
    config = GenerationConfig(max_new_tokens=48, temperature=0, logprobs=True, ignore_eos=True)
    alone = pipe.generate(ids, config, algorithm="none")
    for algorithm in algorithms:
        run = pipe.generate(ids, config, algorithm=algorithm)
        assert run.exact and run.token_ids == alone.token_ids, algorithm
        assert [lp.logprob for lp in run.logprobs] == [lp.logprob for lp in alone.logprobs], algorithm
    longer = ids + alone.token_ids[:8] + ids[:30]
    fresh = Pipeline(pipe.bundle, cache_dir="off").generate(longer, config, algorithm="none")
    reused = pipe.generate(longer, config, algorithm=algorithms[0])
    assert reused.stats.prompt_tokens_reused > 300
    assert reused.token_ids == fresh.token_ids
    assert [lp.logprob for lp in reused.logprobs] == [lp.logprob for lp in fresh.logprobs]


def test_the_check_probes_after_a_real_prefill_too(monkeypatch):
    """A prompt is prefilled in one long call, which a copied past does not reproduce: the load-time check also
    probes after a real prefill of REAL_PAST tokens, and fails when that probe fails."""
    import edge_specdec.runtime.probes as probes

    calls = []

    def probe(session, past=0, copy=True):
        calls.append((past, copy))
        return not (past == probes.REAL_PAST and not copy)  # only the real prefill shows the drift

    monkeypatch.setattr(probes, "is_block_invariant", probe)
    assert passes_block_invariance(object()) is False
    assert (probes.REAL_PAST, False) in calls


def test_a_target_that_fails_every_precision_keeps_the_one_asked_for(bundle_dir, monkeypatch):
    """No precision passes: the session says it is not exact, and runs at the precision asked for (the fastest),
    not at the last one tried."""
    monkeypatch.setattr(session_module, "passes_block_invariance", lambda session: False)
    model = open_model(load_target_xml(bundle_dir), precision="dq")
    assert model.block_invariant is False and model.precision == "dq"


def test_a_run_records_its_target_calls_only_when_asked_and_they_add_up_to_its_stats(cache_off_pipes):
    """record_target_calls keeps each target pass's size, block, past and seconds: one per pass, their seconds adding
    up to Stats.target_seconds, their tokens to the prompt and the proposals plus one per pass beyond the first,
    each past the one before plus what the round kept; off by default, and the output the same either way."""
    pipe = cache_off_pipes(SAME_VOCAB)
    ids = pipe.tokenizer.encode(LONG_TEXT * 8)[:300]
    config = GenerationConfig(max_new_tokens=32, temperature=0, logprobs=True, ignore_eos=True)
    plain = pipe.generate(ids, config, algorithm="standard", lookup=False, guard=False)
    assert plain.stats.target_calls is None and "target_calls" not in plain.stats.as_dict()
    for algorithm in ("none", "standard"):
        pipe.target.reset()
        run = pipe.generate(ids, config, algorithm=algorithm, lookup=False, guard=False, record_target_calls=True)
        calls, stats = run.stats.target_calls, run.stats
        assert len(calls) == stats.target_passes == stats.rounds
        assert sum(c.seconds for c in calls) == pytest.approx(stats.target_seconds, rel=1e-12, abs=1e-12)
        assert calls[0].past == 0 and calls[0].tokens >= len(ids)  # the prefill, with the first proposal
        proposed = stats.draft_tokens_proposed + stats.suffix_tokens_proposed + stats.pool_tokens_proposed
        assert sum(c.tokens for c in calls) == len(ids) + proposed + len(calls) - 1
        for before, after in zip(calls, calls[1:]):
            assert before.past < after.past <= before.past + before.tokens  # the pass's kept tokens, one written
        assert all(c.block >= c.tokens for c in calls[1:])  # a short block may be widened, never cut
        if algorithm == "none":
            assert [c.tokens for c in calls[1:]] == [1] * (len(calls) - 1)
        else:
            assert max(c.tokens for c in calls[1:]) > 1  # verification blocks
        assert list(stats.as_dict()["target_calls"][0]) == [calls[0].tokens, calls[0].block, 0, calls[0].seconds]
        if algorithm == "standard":
            assert run.token_ids == plain.token_ids and run.logprobs == plain.logprobs
