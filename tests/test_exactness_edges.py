"""Exactness at the edges: one-token prompts, near-ties, both precisions and rollbacks, static copies, fixed blocks,
concurrent drafting, the draft's context, padded vocabularies, streamed stops, seeds and cancellation, with
logprobs that let anyone see that a speculative run computed the target alone's bits."""
from __future__ import annotations

import gc
import itertools

import numpy as np
import pytest
from scipy import stats

import edge_specdec.runtime.generate as gen
from edge_specdec.runtime import GenerationConfig, Pipeline
from edge_specdec.runtime.algorithms import REGISTRY
from edge_specdec.runtime.drafters import Proposal
from edge_specdec.runtime.sampling import distribution, penalize, sample, token_logprobs
from edge_specdec.runtime.session import ModelSession
from edge_specdec.runtime.verify import verify
from hostile_text import HOSTILE_STRINGS
from support import EXACTNESS_PROMPTS, OTHER_VOCAB, SAME_VOCAB, bits, forced_logprobs, pipeline_cache

PADDED = ("qwen2-bytelevel", "qwen2-bytelevel-padded", "int8", "int8")
SAME_RUNS = [("standard", {}), ("standard", {"num_assistant_tokens": 3, "confidence": 0.0, "lookup": False}),
             ("prompt-lookup", {"num_assistant_tokens": 2})]
HETERO_RUNS = [("slem", {}), ("slem", {"num_assistant_tokens": 3, "confidence": 0.0, "lookup": False}),
               ("tli", {}), ("slrs", {})]


@pytest.fixture(scope="module")
def pipes(bundle_dir):
    """pipes(pair, **options) -> a Pipeline, built once per module."""
    return pipeline_cache(bundle_dir)


def first_row(pipe: Pipeline, prompt_ids: list[int]) -> np.ndarray:
    """The target's logits for the first new token, computed as a block (the exact path)."""
    session = pipe.target
    session.reset()
    row = session.feed(list(prompt_ids), rows=1)[-1].astype(np.float64)
    session.reset()
    return row


def tie_penalty(pipe: Pipeline, prompt_ids: list[int]) -> float | None:
    """A repetition penalty that brings the best token already in the prompt down onto the best token not in it:
    the first new token is then decided by the last bits of two logits, so any difference between two kernel
    paths shows. None when the prompt's best token is not above the rest (a penalty can only lower it)."""
    row = first_row(pipe, prompt_ids)
    seen = set(prompt_ids)
    order = np.argsort(-row, kind="stable")
    best_seen = next(int(t) for t in order if t in seen)
    best_unseen = next(int(t) for t in order if t not in seen)
    high, low = row[best_seen], row[best_unseen]
    return float(high / low) if high > low > 0 else None


def tied_one_token_prompts(pipe: Pipeline, count: int) -> list[tuple[list[int], float]]:
    """One-token prompts [t] whose first new token sits on a tie made by the penalty."""
    found = []
    for token in range(3, pipe.target.vocab_size):
        penalty = tie_penalty(pipe, [token])
        if penalty is not None:
            found.append(([token], penalty))
            if len(found) == count:
                break
    assert len(found) == count, "no tie point found among the one-token prompts"
    return found


def bits(logprobs) -> list:
    """Each logprob (and its alternatives) as raw float64 bits: equality here is bit-for-bit."""
    return [(lp.token, np.float64(lp.logprob).view(np.int64), [(t, np.float64(v).view(np.int64)) for t, v in lp.top])
            for lp in logprobs]


def assert_exact(pipe: Pipeline, prompt, config: GenerationConfig, runs) -> int:
    """Every run's token ids and logprob bits equal the target alone's on the same pipeline, or (only on a masked
    session) the run reports exact False. Returns how many runs were compared bit for bit."""
    base = pipe.generate(prompt, config, algorithm="none")
    assert base.exact and base.logprobs is not None and len(base.logprobs) == len(base.token_ids)
    compared = 0
    for algorithm, options in runs:
        result = pipe.generate(prompt, config, algorithm=algorithm, **options)
        if not result.exact:
            assert pipe.target.rollback_method == "masked", (algorithm, "a paged session lost its exactness")
            continue
        assert result.token_ids == base.token_ids, (algorithm, options, prompt)
        assert bits(result.logprobs) == bits(base.logprobs), (algorithm, options, prompt)
        compared += 1
    return compared


def tie_config(penalty: float, **kwargs) -> GenerationConfig:
    return GenerationConfig(max_new_tokens=12, ignore_eos=True, repetition_penalty=penalty, logprobs=True,
                            top_logprobs=3, **kwargs)


# --- a one-token prompt is never fed alone (defect 1) ----------------------------------------------------------

def test_a_lone_token_into_an_empty_cache_gets_the_block_rows(pipes):
    """The first token of a one-token prompt is computed on the block path: bit-identical to row 0 of a block."""
    session = pipes(SAME_VOCAB, precision="dq").target
    assert session.block_invariant
    for token in (5, 77, 301):
        session.reset()
        alone = session.feed([token])
        session.reset()
        block = session.feed([token, 9, 10])
        assert np.array_equal(alone[0], block[0])
        assert session.tokens == [token, 9, 10]
    session.reset()
    session.feed([5])
    assert session.tokens == [5]  # the pad is forgotten


@pytest.mark.parametrize("precision", ["dq", "f32"])
def test_one_token_prompts_at_a_tie_are_exact(pipes, precision):
    pipe = pipes(SAME_VOCAB, precision=precision)
    for prompt, penalty in tied_one_token_prompts(pipe, 4):
        config = GenerationConfig(max_new_tokens=6, ignore_eos=True, repetition_penalty=penalty)
        base = pipe.generate(prompt, config, algorithm="none")
        for algorithm in ("standard", "prompt-lookup"):
            assert pipe.generate(prompt, config, algorithm=algorithm).token_ids == base.token_ids, (prompt, algorithm)


# --- the tie-point check over every path ------------------------------------------------------------------------

PATHS = [
    (SAME_VOCAB, {"precision": "dq"}), (SAME_VOCAB, {"precision": "f32"}),
    (SAME_VOCAB, {"precision": "dq", "concurrent": True}), (SAME_VOCAB, {"precision": "f32", "concurrent": True}),
    (SAME_VOCAB, {"precision": "dq", "static_shapes": True, "fixed_blocks": True}),
    (SAME_VOCAB, {"precision": "dq", "static_shapes": False, "fixed_blocks": False}),
    (SAME_VOCAB, {"kv_rollback": "masked"}),
    (OTHER_VOCAB, {"precision": "dq"}), (OTHER_VOCAB, {"precision": "f32"}),
    (OTHER_VOCAB, {"precision": "dq", "concurrent": True}),
    (OTHER_VOCAB, {"kv_rollback": "masked"}),
]


# the fast tier: each option on the same-vocabulary pair (static copies and fixed blocks on, as by default on the
# tiny models), and the other pair on the default engine
FAST_PATHS = [path for path in PATHS if path[0] == SAME_VOCAB and path not in (PATHS[3], PATHS[5])] + [PATHS[7]]


@pytest.mark.parametrize("pair,options", [pytest.param(p, o, marks=() if (p, o) in FAST_PATHS else pytest.mark.slow,
                                                       id=f"{p[1]}-{'-'.join(f'{k}={v}' for k, v in o.items())}")
                                          for p, o in PATHS])
def test_every_path_is_exact_at_tie_points(pipes, pair, options):
    """One-token and hostile prompts, each at a penalty that ties its first token: every algorithm gives the
    target alone's token ids and logprob bits (a masked session says it is not exact instead)."""
    pipe = pipes(pair, **options)
    runs = SAME_RUNS if pair == SAME_VOCAB else HETERO_RUNS
    prompts = [ids for ids, _ in tied_one_token_prompts(pipe, 2)]
    for text in HOSTILE_STRINGS + ["def fib(n):\n    return fib(n - 1) + fib(n - 2)", "a b a b a b a b"]:
        ids = pipe.tokenizer.encode(text)
        if len(ids) > 1 and tie_penalty(pipe, ids) is not None:
            prompts.append(ids)
        if len(prompts) == 4:
            break
    assert len(prompts) == 4
    compared = sum(assert_exact(pipe, ids, tie_config(tie_penalty(pipe, ids)), runs) for ids in prompts)
    if options.get("kv_rollback") == "masked":
        assert compared == 0  # a masked session never claims exactness for a speculative run
    else:
        assert compared == len(prompts) * len(runs)


def test_the_tie_point_check_catches_a_lone_feed(bundle_dir, monkeypatch):
    """A session that feeds lone tokens (the defect the check exists for) fails the tie-point check."""
    pipe = Pipeline(bundle_dir(*SAME_VOCAB), precision="dq", static_shapes=False, fixed_blocks=False)
    prompts = [ids for ids, _ in tied_one_token_prompts(pipe, 2)]
    monkeypatch.setattr(ModelSession, "least_block", property(lambda self: 1))
    with pytest.raises(AssertionError):
        for ids in prompts:
            assert_exact(pipe, ids, tie_config(tie_penalty(pipe, ids)), SAME_RUNS)


# --- masked rollback says it is not exact (defect 2) ------------------------------------------------------------

def test_masked_rollback_reports_that_it_is_not_exact(pipes):
    masked, paged = pipes(SAME_VOCAB, kv_rollback="masked"), pipes(SAME_VOCAB, precision="dq")
    config = GenerationConfig(max_new_tokens=8, ignore_eos=True)
    assert not masked.generate("def f(x):", config, algorithm="standard").exact
    assert masked.generate("def f(x):", config, algorithm="none").exact  # the target alone is its own reference
    assert paged.generate("def f(x):", config, algorithm="standard").exact


@pytest.mark.slow
def test_cli_warns_once_when_a_run_is_not_exact(bundle_dir):
    import subprocess
    import sys
    args = [sys.executable, "-m", "edge_specdec.cli", "run", str(bundle_dir(*SAME_VOCAB)), "--prompt", "def f(",
            "--max-new-tokens", "6", "--algorithm", "standard"]
    masked = subprocess.run(args + ["--kv-rollback", "masked"], capture_output=True, text=True, timeout=300)
    paged = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert masked.returncode == 0 and paged.returncode == 0, masked.stderr + paged.stderr
    assert masked.stderr.count("warning: this run is exact only up to float noise") == 1
    assert "warning" not in paged.stderr


# --- the draft's context never fails a run (defect 3) -----------------------------------------------------------

@pytest.mark.parametrize("pair,algorithm", [(SAME_VOCAB, "standard"), (OTHER_VOCAB, "slem"), (OTHER_VOCAB, "tli")])
def test_a_draft_out_of_context_finishes_with_the_target_alone(pipes, pair, algorithm, monkeypatch):
    """A prompt that leaves the draft almost no room (its context far shorter than the target's, or its tokenizer
    spelling the text with more tokens) completes, drafting concurrently, identical to the target alone."""
    pipe = pipes(pair, precision="dq", concurrent=True)
    prompt = "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n" * 2
    draft_ids = pipe.draft_retokenizer.encode(prompt) if pair == OTHER_VOCAB else pipe.tokenizer.encode(prompt)
    monkeypatch.setattr(pipe.draft, "max_context", len(draft_ids) + 6)
    config = GenerationConfig(max_new_tokens=40, ignore_eos=True, logprobs=True)
    base = pipe.generate(prompt, config, algorithm="none")
    spec = pipe.generate(prompt, config, algorithm=algorithm, lookup=False)
    assert spec.token_ids == base.token_ids and bits(spec.logprobs) == bits(base.logprobs)
    assert spec.stats.draft_tokens_proposed > 0  # it drafted while there was room, then the target went on alone


# --- a padded same-vocabulary draft (defect 4) ------------------------------------------------------------------

@pytest.mark.slow
def test_a_draft_with_more_logits_than_the_target_samples_and_stays_exact(pipes):
    pipe = pipes(PADDED)
    assert pipe.bundle.vocabulary["relation"] == "identical"
    assert pipe.draft.vocab_size == pipe.target.vocab_size + 4
    greedy = GenerationConfig(max_new_tokens=16, ignore_eos=True)
    assert (pipe.generate("def f(x):", greedy, algorithm="standard").token_ids
            == pipe.generate("def f(x):", greedy, algorithm="none").token_ids)
    for seed in range(20):  # sampling verified a q over the target's logits (the widths used to clash)
        config = GenerationConfig(max_new_tokens=8, temperature=1.0, seed=seed, ignore_eos=True)
        result = pipe.generate("x = ", config, algorithm="standard", confidence=0.0)
        assert len(result.token_ids) == 8 and max(result.token_ids) < pipe.target.vocab_size


def test_draft_rows_are_fitted_to_the_target_width():
    from edge_specdec.runtime.drafters import to_width
    row = np.arange(6, dtype=np.float32)
    assert to_width(row, 4).tolist() == [0, 1, 2, 3]  # the draft's extra ids (its best ones here) are dropped
    wide = to_width(row, 8)
    assert wide[:6].tolist() == row.tolist() and np.isneginf(wide[6:]).all()
    assert distribution(wide, GenerationConfig(temperature=1.0))[6:].sum() == 0.0


# --- streamed text equals the result's text (defect 5) ----------------------------------------------------------

@pytest.mark.parametrize("pair,algorithm", [(SAME_VOCAB, "none"), (SAME_VOCAB, "standard"),
                                            (SAME_VOCAB, "prompt-lookup"), (OTHER_VOCAB, "slem"), (OTHER_VOCAB, "tli")])
def test_streamed_text_never_shows_a_stop_string(pipes, pair, algorithm):
    pipe = pipes(pair, precision="dq")
    config = GenerationConfig(max_new_tokens=40, ignore_eos=True)
    full = pipe.generate("def f(x):", config, algorithm="none").text
    for stop in (full[10:14], full[20:21], full[25:27] + "\u2603"):  # the last one never occurs
        streamed: list[str] = []
        result = pipe.generate("def f(x):", GenerationConfig(max_new_tokens=40, ignore_eos=True, stop_strings=[stop]),
                               algorithm=algorithm, on_text=streamed.append)
        assert "".join(streamed) == result.text, (stop, algorithm)
        check_pieces(streamed, result)
        if stop in full:
            assert result.stop_reason == "stop_string" and result.text == full[:full.find(stop)]
        else:
            assert result.text == full
        iterator = pipe.stream("def f(x):", GenerationConfig(max_new_tokens=40, ignore_eos=True,
                                                             stop_strings=[stop]), algorithm=algorithm)
        assert "".join(iterator) == iterator.result.text == result.text


def check_pieces(pieces, result) -> None:
    """Each streamed piece is its spans' text; the pieces hand over the run's tokens in order, each once, and no
    more drafted tokens (the draft model's and free copies') than the target accepted."""
    handed = [t for piece in pieces for t in piece.token_ids]
    assert all(piece == "".join(span.text for span in piece.spans) for piece in pieces)
    assert all(sum(span.tokens for span in piece.spans) == len(piece.token_ids) for piece in pieces)
    assert handed == result.token_ids[:len(handed)]
    st = result.stats
    drafted = st.draft_tokens_accepted + st.suffix_tokens_accepted + st.pool_tokens_accepted
    assert sum(span.tokens for piece in pieces for span in piece.spans if span.drafted) <= drafted
    if result.stop_reason == "length":  # nothing held back: every token was handed over
        assert len(handed) == len(result.token_ids)
        assert sum(span.tokens for piece in pieces for span in piece.spans if span.drafted) == drafted


# --- a seed reproduces a sampled run whatever the policy and the clock (defect 6) ---------------------------------

@pytest.mark.parametrize("policy", ["fixed", "schedule", "cost"])
@pytest.mark.parametrize("pair,algorithm", [(SAME_VOCAB, "standard"), (SAME_VOCAB, "prompt-lookup"),
                                            (OTHER_VOCAB, "tli"), (OTHER_VOCAB, "slrs")])
def test_a_seed_reproduces_a_sampled_run_on_an_erratic_clock(pipes, pair, algorithm, policy, monkeypatch):
    pipe = pipes(pair, precision="dq")
    clock = itertools.accumulate(np.random.default_rng(7).lognormal(-5.0, 2.0, 100_000))
    monkeypatch.setattr(gen.time, "perf_counter", lambda: next(clock))  # each reading: a random machine speed
    config = GenerationConfig(max_new_tokens=24, temperature=1.0, top_k=50, seed=42, ignore_eos=True)
    outputs = {tuple(pipe.generate("x = ", config, algorithm=algorithm, draft_policy=policy,
                                   num_assistant_tokens=4).token_ids) for _ in range(4)}
    assert len(outputs) == 1, outputs


def test_priced_cost_policy_follows_the_acceptance_not_the_clock(pipes, monkeypatch):
    """Fed the same accepted counts with random timings, the cost policy chooses the same lengths when priced, and
    other lengths when it reads the clock (so a seeded sampled run would draw its numbers in other rounds)."""
    from edge_specdec.runtime import drafters

    def lengths(prices, timing_seed: int) -> list[int]:
        timing = np.random.default_rng(timing_seed).lognormal(-5.0, 2.0, size=(60, 2))
        accepted = np.random.default_rng(0).binomial(4, 0.8, size=60)
        policy, out = drafters.DraftLength(4, "cost", prices=prices), []
        for (draft_s, target_s), n in zip(timing, accepted):
            proposed = policy.k
            policy.update(min(int(n), proposed), proposed, draft_s, target_s)
            out.append(policy.k)
        return out

    prices = (0.2, 1.0, 0.1)
    assert lengths(prices, 1) == lengths(prices, 2) == lengths(prices, 3)
    assert len({tuple(lengths(None, seed)) for seed in (1, 2, 3)}) > 1
    seen = []  # the pipeline prices a seeded sampled run's cost policy, and only that
    monkeypatch.setattr("edge_specdec.runtime.pipeline.DraftLength",
                        lambda *args, prices=None, **kwargs: seen.append(prices)
                        or drafters.DraftLength(*args, prices=prices, **kwargs))
    pipe = pipes(SAME_VOCAB, precision="dq")
    for seed, temperature in ((42, 1.0), (None, 1.0), (42, 0.0)):
        pipe.generate("x", GenerationConfig(max_new_tokens=3, temperature=temperature, seed=seed), draft_policy="cost")
    assert seen[0] is not None and 0 < seen[0][0] < 1 and seen[1:] == [None, None]


# --- logprobs ---------------------------------------------------------------------------------------------------

@pytest.mark.core
@pytest.mark.parametrize("algorithm", [name for name in REGISTRY if name != "none"])
def test_every_algorithm_writes_the_target_alones_greedy_ids_and_logprob_bits(pipes, algorithm):
    """Each algorithm of the registry, on the smallest pair it serves (the same-vocabulary draft for those that
    need one, else the other-vocabulary draft), writes the target alone's token ids and logprob bits, the
    alternatives' too, on every exactness prompt; and it drafted, so the check is not of the target alone. No
    draft pool: a run would copy the target alone's answer to the same prompt from it and leave the drafter idle."""
    pair = OTHER_VOCAB if "heterogeneous" in REGISTRY[algorithm].relations else SAME_VOCAB
    pipe = pipes(pair, precision="dq")
    config = GenerationConfig(max_new_tokens=16, ignore_eos=True, logprobs=True, top_logprobs=2)
    drafted = 0
    for prompt in EXACTNESS_PROMPTS:
        alone = pipe.generate(prompt, config, algorithm="none", pool_scope=None)
        run = pipe.generate(prompt, config, algorithm=algorithm, confidence=0.0, pool_scope=None)
        assert run.token_ids == alone.token_ids and bits(run.logprobs) == bits(alone.logprobs), prompt
        drafted += run.stats.draft_tokens_proposed + run.stats.suffix_tokens_proposed  # a model's, or copies
    assert drafted > 0, "no round drafted: the check compared the target alone with itself"


@pytest.mark.parametrize("pair,algorithm", [(SAME_VOCAB, "standard"), (OTHER_VOCAB, "tli"), (OTHER_VOCAB, "slem")])
def test_sampled_runs_compute_every_position_with_the_target_alones_bits(pipes, pair, algorithm):
    """Positions after rollbacks, with the penalty: each sampled token's logprob equals, bit for bit, the target's
    logprob of it computed in one block from scratch; with the verifier's rule (tested alone below) that is the
    whole lossless argument."""
    pipe = pipes(pair, precision="dq")
    prompt_ids = pipe.tokenizer.encode("def f(x):\n    return x")
    rolled_back = 0
    for seed in range(4):
        config = GenerationConfig(max_new_tokens=24, temperature=0.9, top_p=0.95, seed=seed, ignore_eos=True,
                                  repetition_penalty=1.2, logprobs=True, top_logprobs=2)
        result = pipe.generate(prompt_ids, config, algorithm=algorithm, num_assistant_tokens=4, confidence=0.0)
        rolled_back += result.stats.draft_tokens_proposed > result.stats.draft_tokens_accepted
        assert bits(result.logprobs) == bits(forced_logprobs(pipe, prompt_ids, result.token_ids, config))
    assert rolled_back >= 2  # positions after rollbacks were among those checked


def test_logprobs_are_log_softmax_of_the_deciding_logits():
    rows = np.array([[2.0, 1.0, -1.0, 0.5], [0.0, 3.0, 3.0, 1.0]], dtype=np.float32)
    config = GenerationConfig(temperature=0.5, top_logprobs=2)
    out = token_logprobs(rows, [0, 2], config)
    x = rows.astype(np.float64) / 0.5
    expected = x - np.log(np.exp(x).sum(axis=1, keepdims=True))
    assert np.allclose([out[0].logprob, out[1].logprob], [expected[0, 0], expected[1, 2]], atol=1e-12)
    assert [t for t, _ in out[0].top] == [0, 1] and {t for t, _ in out[1].top} == {1, 2}
    assert np.isclose(np.exp(expected[0]).sum(), 1.0)


@pytest.mark.slow
def test_logprobs_through_the_cli_json(bundle_dir):
    import json
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "edge_specdec.cli", "run", str(bundle_dir(*SAME_VOCAB)), "--prompt",
                          "def f(", "--max-new-tokens", "5", "--ignore-eos", "--logprobs", "3", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["exact"] is True and len(data["logprobs"]) == len(data["token_ids"]) == 5
    for token, entry in zip(data["token_ids"], data["logprobs"]):
        assert entry["token_id"] == token and entry["logprob"] <= 0 and len(entry["top_logprobs"]) == 3
        assert entry["top_logprobs"][0]["logprob"] >= entry["logprob"]  # greedy: the token is the best one
        assert entry["top_logprobs"][0]["token_id"] == token


def test_top_logprobs_out_of_range_is_a_clear_error(pipes):
    from edge_specdec.errors import EdgeSpecdecError
    with pytest.raises(EdgeSpecdecError, match="top_logprobs"):
        pipes(SAME_VOCAB, precision="dq").generate("x", GenerationConfig(top_logprobs=21))


# --- verify() alone, over 100,000 draws --------------------------------------------------------------------------

def draws(n: int, logits: np.ndarray, config: GenerationConfig, context: list[int], q_rows, first: int, rng,
          rule=verify):
    """n rounds of a 2-token proposal (drawn from q_rows, or [first, 1] when q_rows is None). Returns the first
    output tokens, and, for the rounds that kept a drafted `first`, the second output token."""
    firsts, seconds = [], []
    for _ in range(n):
        if q_rows is None:
            proposal = Proposal([first, 1], None)
        else:
            proposal = Proposal([sample(q_rows[0], rng), sample(q_rows[1], rng)], [q_rows[0], q_rows[1]])
        accepted, token, _ = rule(logits, proposal, config, rng, context)
        out = proposal.tokens[:accepted] + [token]
        firsts.append(out[0])
        if accepted >= 1 and proposal.tokens[0] == first:
            seconds.append(out[1])
    return np.array(firsts), np.array(seconds)


def goodness(observed: np.ndarray, p: np.ndarray) -> float:
    counts = np.bincount(observed, minlength=len(p))
    keep = p * len(observed) >= 5
    expected = p[keep] * len(observed)
    return float(stats.chisquare(counts[keep], expected * counts[keep].sum() / expected.sum()).pvalue)


@pytest.mark.slow
@pytest.mark.parametrize("with_q", [True, False])
def test_verify_alone_outputs_the_target_distribution(with_q):
    """The first output token follows p at the first position, and the second, after the first drafted token was
    kept, follows p at the second position (penalty included): 100,000 rounds, false-alarm rate 1e-3 each."""
    rng = np.random.default_rng(11)
    vocab = 10
    logits = (rng.normal(size=(3, vocab)) * 1.5).astype(np.float32)
    context = [3, 3, 5]  # the penalty lowers 3 and 5 everywhere, and the kept first token on the second row
    config = GenerationConfig(temperature=0.8, repetition_penalty=1.4)
    p0 = distribution(penalize(logits[:1], config, context, []), config)[0]
    first = int(np.argmax(np.where(np.isin(np.arange(vocab), context), 0.0, p0)))
    q_rows = list(rng.dirichlet(np.ones(vocab), size=2)) if with_q else None
    firsts, seconds = draws(100_000, logits, config, context, q_rows, first, rng)
    p = distribution(penalize(logits, config, context, [first, 1]), config)  # row 1 follows a kept `first`
    assert goodness(firsts, p[0]) > 1e-3
    assert len(seconds) > 5_000 and goodness(seconds, p[1]) > 1e-3
    if with_q:  # the test can fail: accepting every drafted token gives q, not p
        def accept_all(rows, proposal, config, rng, context, grammar=None):
            return len(proposal.tokens), 0, rows
        broken, _ = draws(20_000, logits, config, context, q_rows, first, rng, rule=accept_all)
        assert goodness(broken, p[0]) < 1e-6


# --- Ctrl-C mid-round, an abandoned stream ---------------------------------------------------------------------

@pytest.mark.parametrize("where", ["target", "draft"])
def test_ctrl_c_mid_round_then_the_next_call_is_exact(pipes, where, monkeypatch):
    pipe = pipes(SAME_VOCAB, precision="dq")
    config = GenerationConfig(max_new_tokens=30, ignore_eos=True, logprobs=True)
    session = getattr(pipe, where)
    feed, calls = session.feed, itertools.count()

    def interrupted(tokens, rows=None):
        if next(calls) == 6:
            raise KeyboardInterrupt
        return feed(tokens, rows)

    monkeypatch.setattr(session, "feed", interrupted)
    stopped = pipe.generate("def f(x):", config, algorithm="standard", lookup=False)
    assert stopped.stop_reason == "interrupted" and len(stopped.token_ids) < 30
    monkeypatch.undo()
    base = pipe.generate("def f(x):", config, algorithm="none")
    again = pipe.generate("def f(x):", config, algorithm="standard", lookup=False)
    assert again.token_ids == base.token_ids and bits(again.logprobs) == bits(base.logprobs)
    assert stopped.token_ids == base.token_ids[:len(stopped.token_ids)]


@pytest.mark.parametrize("iterated", [True, False])
def test_an_abandoned_stream_stops_within_a_round(pipes, iterated, monkeypatch):
    pipe = pipes(SAME_VOCAB, precision="dq")
    feeds = itertools.count()
    feed = pipe.target.feed
    monkeypatch.setattr(pipe.target, "feed", lambda tokens, rows=None: (next(feeds), feed(tokens, rows))[1])
    config = GenerationConfig(max_new_tokens=400, ignore_eos=True)
    iterator = pipe.stream("def f(x):", config, algorithm="standard", confidence=0.0, num_assistant_tokens=1)
    if iterated:
        pieces = iter(iterator)
        next(pieces)
        del pieces
    del iterator
    gc.collect()
    at_drop = next(feeds)
    assert pipe._lock.acquire(timeout=30), "the abandoned generation still holds the pipeline"
    pipe._lock.release()
    assert next(feeds) - at_drop <= 4  # the round in flight, then it stopped
    assert at_drop < 350
