"""Static shapes: copies of a model compiled for one block size each, sharing the session's KV blocks."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from edge_specdec.runtime import GenerationConfig, Pipeline
from edge_specdec.runtime import pipeline as pipeline_module
from edge_specdec.runtime import session as session_module
from edge_specdec.runtime.pipeline import DRAFT_BLOCK, DRAFT_TOKENS
from edge_specdec.runtime.session import open_session
from support import EXACTNESS_PROMPTS, OTHER_VOCAB, SAME_VOCAB, load_target_xml, spy_block_sizes


def logprob_bits(result) -> list:
    return [np.float64(lp.logprob).view(np.int64) for lp in result.logprobs]


def test_static_copies_give_the_bits_of_the_dynamic_model(bundle_dir):
    """Random blocks and rollbacks, past the first growth of the KV blocks: the same logits with and without
    copies, and every call of a static size ran on its copy."""
    xml = load_target_xml(bundle_dir)
    plain, shaped = open_session(xml), open_session(xml)
    shaped.add_static([2, 3, 5])
    assert shaped.block_invariant and shaped.static_sizes == {2, 3, 5}
    rng = np.random.default_rng(3)
    prefix = rng.integers(0, 700, 4).tolist()
    assert np.array_equal(plain.feed(prefix), shaped.feed(prefix))  # so that a lone token has one to re-feed
    for step in range(150):
        tokens = rng.integers(0, 700, int(rng.integers(1, 7))).tolist()
        a, b = plain.feed(tokens), shaped.feed(tokens)
        assert np.array_equal(a, b), step
        n = max(2, len(tokens))  # a lone token is fed with the one before it
        if n in shaped.static_sizes:
            ran = shaped._static[n].get_tensor("input_ids").data
            assert ran.tolist() == shaped.tokens[-n:], step
        back = int(rng.integers(0, len(tokens) + 1))
        plain.rollback(back)
        shaped.rollback(back)
    assert shaped.length > 4 * shaped.block_size  # the cache grew, and the copies followed


def test_copies_that_change_the_bits_are_dropped(bundle_dir, monkeypatch):
    session = open_session(load_target_xml(bundle_dir))
    monkeypatch.setattr(session_module, "passes_block_invariance", lambda s: False)
    session.add_static([2, 3])
    assert session.static_sizes == frozenset() and session.length == 0
    assert session.feed([5, 6, 7]).shape[0] == 3  # still decodes, on the dynamic model


def test_a_masked_session_has_no_static_copies(bundle_dir):
    masked = open_session(load_target_xml(bundle_dir), rollback="masked")
    assert masked.static_sizes == frozenset() and not hasattr(masked, "add_static")


@pytest.fixture(scope="module")
def pipes(bundle_dir):
    """The tiny test models are small, so they get static copies by default; fixed blocks are forced so that
    the sizes do not depend on a measurement."""
    pipes = {(vocab, static): Pipeline(bundle_dir(*(SAME_VOCAB if vocab == "same" else OTHER_VOCAB)),
                                       static_shapes=None if static else False, fixed_blocks=True)
             for vocab in ("same", "hetero") for static in (True, False)}
    for pipe in pipes.values():
        pipe.compile_static_copies()
    return pipes


@pytest.mark.parametrize("algorithm", ["standard", pytest.param("slem", marks=pytest.mark.slow)])
def test_greedy_stays_lossless_with_static_shapes(pipes, algorithm, monkeypatch):
    vocab = "same" if algorithm == "standard" else "hetero"
    shaped, plain = pipes[vocab, True], pipes[vocab, False]
    k = DRAFT_TOKENS  # the copies compiled after the load are for the default draft length
    config = GenerationConfig(max_new_tokens=20, ignore_eos=True)
    target_sizes = spy_block_sizes(shaped.target, monkeypatch)
    draft_sizes = spy_block_sizes(shaped.draft, monkeypatch)
    for prompt in EXACTNESS_PROMPTS:
        base = plain.generate(prompt, config, algorithm="none")
        del target_sizes[:], draft_sizes[:]
        # the draft model drafts every round (a free copy's block has a length of its own)
        spec = shaped.generate(prompt, config, algorithm=algorithm, num_assistant_tokens=k, confidence=0.0,
                               lookup=False)
        assert spec.token_ids == base.token_ids, (algorithm, prompt)
        # after the prompt, every call of the target and every short call of the draft ran on a copy
        assert set(target_sizes[1:]) <= shaped.target.static_sizes
        assert {n for n in draft_sizes[1:] if n <= DRAFT_BLOCK} <= shaped.draft.static_sizes
    assert k + 1 in shaped.target.static_sizes and shaped.target.min_block == k + 1
    assert shaped.draft.static_sizes == {1, DRAFT_BLOCK} and shaped.draft.min_block == DRAFT_BLOCK
    assert plain.target.static_sizes == frozenset() and plain.draft.static_sizes == frozenset()


def test_the_target_alone_steps_on_a_copy(bundle_dir, monkeypatch):
    pipe = Pipeline(bundle_dir(*SAME_VOCAB))
    pipe.compile_static_copies()
    sizes = spy_block_sizes(pipe.target, monkeypatch)
    pipe.generate("def fib(n):", GenerationConfig(max_new_tokens=4), algorithm="none")
    del sizes[:]
    pipe.generate("def fib(n):", GenerationConfig(max_new_tokens=6, ignore_eos=True), algorithm="none")
    step = pipe.target.min_block
    assert step in (2, 3) and step in pipe.target.static_sizes and sizes[1:] == [step] * 5


def test_without_fixed_blocks_the_copies_serve_single_steps_and_full_blocks(bundle_dir, pipes):
    pipe = Pipeline(bundle_dir(*SAME_VOCAB), fixed_blocks=False)
    pipe.compile_static_copies()
    config = GenerationConfig(max_new_tokens=16, ignore_eos=True)
    for prompt in EXACTNESS_PROMPTS[:4]:
        base = pipes["same", False].generate(prompt, config, algorithm="none")
        assert pipe.generate(prompt, config, algorithm="standard", num_assistant_tokens=4).token_ids == base.token_ids
    assert pipe.target.static_sizes == {2, DRAFT_TOKENS + 1} and pipe.target.min_block == 1
    assert pipe.draft.static_sizes == {1, DRAFT_BLOCK} and pipe.draft.min_block == 1


def test_copies_serve_only_once_checked(bundle_dir, monkeypatch):
    """While a copy's bits are checked, sessions on the model still run on the dynamic model: the check runs on a
    scratch session that has the new copies, the model gets them only once they passed."""
    session = open_session(load_target_xml(bundle_dir))
    served_during_check = []

    def check(scratch) -> bool:
        served_during_check.append(set(session.static_sizes))
        return scratch.static_sizes == {2, 3}
    monkeypatch.setattr(session_module, "passes_block_invariance", check)
    session.add_static([2, 3])
    assert served_during_check == [set()] and session.static_sizes == {2, 3}


def test_the_load_compiles_no_copy_and_the_first_call_of_a_size_compiles_its_own(bundle_dir, monkeypatch):
    """Engine() compiles no static copy: it plans them. The first request that calls a planned size compiles that
    copy in its own thread, runs it once and checks its bits, then runs on it; the first request already has the
    target alone's ids and logprob bits, and so do the ones after it, which compile nothing."""
    plain = Pipeline(bundle_dir(*SAME_VOCAB), static_shapes=False)
    config = GenerationConfig(max_new_tokens=16, ignore_eos=True, logprobs=True)
    expected = [plain.generate(prompt, config, algorithm="none") for prompt in EXACTNESS_PROMPTS[:3]]
    compiled, here = [], threading.current_thread()  # (block size, compiling thread)
    compile_for_block = session_module.compile_for_block
    monkeypatch.setattr(session_module, "compile_for_block", lambda *args: compiled.append(
        (args[-1], threading.current_thread())) or compile_for_block(*args))
    pipe = Pipeline(bundle_dir(*SAME_VOCAB), fixed_blocks=True)
    assert compiled == [] and pipe.target_model.static == {} and pipe.draft_model.static == {}
    step = pipe.block_shapes(0, False)["target"]  # the target's cheapest single step, 2 or 3 tokens
    assert pipe.target_model.planned == {step, DRAFT_TOKENS + 1} and pipe.draft_model.planned == {1, DRAFT_BLOCK}
    target_sizes = spy_block_sizes(pipe.target, monkeypatch)
    # the draft model drafts its full length every round: a block of every planned size in the first request
    for i, (prompt, result) in enumerate(zip(EXACTNESS_PROMPTS, expected)):
        del target_sizes[:]
        got = pipe.generate(prompt, config, algorithm="standard", lookup=False, confidence=0.0)
        assert got.token_ids == result.token_ids and logprob_bits(got) == logprob_bits(result)
        assert set(target_sizes[1:]) <= pipe.target.static_sizes  # after the prompt, every call on a copy
        if i == 0:  # the first request compiled the copies of the sizes it called, in its own thread
            assert sorted(n for n, _ in compiled) == sorted({*pipe.target_model.static, *pipe.draft_model.static})
            assert DRAFT_TOKENS + 1 in pipe.target_model.static and set(pipe.draft_model.static) == {1, DRAFT_BLOCK}
            assert all(thread is here for _, thread in compiled)
            del compiled[:]
    assert compiled == []


def test_a_request_compiles_only_the_planned_copies_it_calls_and_before_its_run(bundle_dir, monkeypatch):
    """The target alone's first request compiles the target's single step only, before its run starts (its Stats
    and its drafting guard never time a compile); the first drafting request compiles the fixed blocks; a request
    with another draft length compiles nothing more."""
    compiled, started = [], []  # (block size, runs started before it compiled)
    compile_for_block = session_module.compile_for_block
    monkeypatch.setattr(session_module, "compile_for_block",
                        lambda *args: compiled.append((args[-1], len(started))) or compile_for_block(*args))
    pipe = Pipeline(bundle_dir(*SAME_VOCAB), fixed_blocks=True)
    step = pipe.block_shapes(0, False)["target"]
    run = pipeline_module.generate
    monkeypatch.setattr(pipeline_module, "generate", lambda *a, **k: started.append(1) or run(*a, **k))
    config = GenerationConfig(max_new_tokens=8, ignore_eos=True)
    pipe.generate("def f(", config, algorithm="none")
    assert compiled == [(step, 0)] and set(pipe.target_model.static) == {step} and pipe.draft_model.static == {}
    pipe.generate("def f(", config, algorithm="standard", num_assistant_tokens=DRAFT_TOKENS)
    assert sorted(compiled) == sorted([(step, 0), (DRAFT_TOKENS + 1, 1), (1, 1), (DRAFT_BLOCK, 1)])
    assert pipe.target_model.planned == pipe.draft_model.planned == frozenset()
    pipe.generate("def f(", config, algorithm="standard", num_assistant_tokens=3)
    assert len(compiled) == 4


def test_a_planned_copy_that_changes_the_bits_is_tried_once(bundle_dir, monkeypatch):
    """A target's copy that fails the bit check is dropped with every copy before it, and nothing more is
    compiled for that model: later calls of the size run on the dynamic model without trying again."""
    session = open_session(load_target_xml(bundle_dir))
    model = session.model
    model.add_static([3])
    compiled = []
    compile_static = model._compile_static
    model._compile_static = lambda n: compiled.append(n) or compile_static(n)
    model.plan_static([2, 3, 4])
    assert model.planned == {2, 4}  # 3 has its copy already
    monkeypatch.setattr(session_module, "passes_block_invariance", lambda s: False)
    model.compile_planned([2, 3])
    assert compiled == [2] and model.static == {} and model.planned == frozenset()
    model.compile_planned()
    assert compiled == [2] and session.feed([5, 6, 7, 8]).shape[0] == 4


def test_a_request_does_not_wait_for_a_copy_another_one_compiles(bundle_dir):
    """Two requests start at once: the first compiles the copy, the second goes on without it (its calls of that
    size on the dynamic model, with the same bits) until the copy serves."""
    xml = load_target_xml(bundle_dir)
    plain, session = open_session(xml), open_session(xml)
    model = session.model
    entered, gate = threading.Event(), threading.Event()
    compile_static = model._compile_static

    def held_back(n):  # the first thread's compile, held until the second has asked
        entered.set()
        assert gate.wait(120)
        return compile_static(n)
    model._compile_static = held_back
    model.plan_static([2])
    first = threading.Thread(target=model.compile_planned, args=([2],))
    first.start()
    try:
        assert entered.wait(120)
        model.compile_planned([2])  # returns at once
        assert model.static == {} and model.planned == frozenset()
        for tokens in ([1, 2, 3], [4, 5]):
            assert np.array_equal(session.feed(tokens), plain.feed(tokens))
    finally:
        gate.set()
        first.join(120)
    assert set(model.static) == {2}
    assert np.array_equal(session.feed([6, 7]), plain.feed([6, 7])) and session._static[2] is not None
