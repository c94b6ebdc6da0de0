"""The one-token-sequences layout after a long prompt (session.py, "One-token sequences"): a session fed a prompt of
at least SEQUENCES_AFTER tokens feeds every later token as a one-token sequence over its block table, and the
prompt in blocks. A token's row is the same whatever the call that holds it; a position always takes one layout;
a later request reuses only the prompt's part of the cache. The threshold is made small here (THRESHOLD)."""
from __future__ import annotations

import numpy as np
import pytest

import edge_specdec.runtime.session as session_module
from edge_specdec.runtime.batching import Call, ModelQueue
from edge_specdec.runtime.probes import passes_block_invariance, passes_sequences_layout
from edge_specdec.runtime.session import BlockPool, PagedSession, open_model, sequence_pads
from support import load_target_xml, spy_block_sizes

THRESHOLD = 48
PAST = 1100  # beyond 1024 tokens: several KV blocks per attention work item


@pytest.fixture
def small_threshold(monkeypatch):
    monkeypatch.setattr(session_module, "SEQUENCES_AFTER", THRESHOLD)


@pytest.fixture(scope="module")
def model(bundle_dir):
    return open_model(load_target_xml(bundle_dir), known_invariant={"dq": True}, known_longest={"dq": 64})


def _tokens(seed: int, n: int, vocab: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab, n).tolist()


def test_the_model_takes_the_layout_and_a_short_prompt_keeps_the_blocks(model, small_threshold):
    assert model.sequences and model.threads >= 1
    session = model.session()
    short, long = _tokens(0, THRESHOLD - 1, model.vocab_size), _tokens(0, THRESHOLD, model.vocab_size)
    session.feed(short, rows=1)
    session.end_prompt(short)
    assert session.sequences_from is None
    session.reset()
    session.feed(long, rows=1)
    session.end_prompt(long)
    assert session.sequences_from == THRESHOLD
    not_exact = model.session()
    not_exact.block_invariant = False
    not_exact.end_prompt(long)
    assert not_exact.sequences_from is None


@pytest.mark.parametrize("past", [THRESHOLD, PAST])
def test_a_tokens_row_is_the_same_in_calls_of_1_to_8(model, past):
    """Each token's row from calls of n tokens, n = 1..8 (the calls of one n one after another, each reading the
    slots the calls before wrote), equals its row from one call of them all; and it is not the block layout's row
    (so the layout matters)."""
    session = model.session()
    session.feed(_tokens(1, past, model.vocab_size), rows=1)
    session.sequences_from = past
    tokens = _tokens(2, 16, model.vocab_size)
    whole = session.feed(tokens)
    for n in range(1, 9):
        session.rollback(len(tokens))
        rows = np.concatenate([session.feed(tokens[i:i + n]) for i in range(0, len(tokens), n)])
        assert np.array_equal(rows, whole), n
    session.rollback(len(tokens))
    session.sequences_from = None
    blocks = session.feed(tokens)
    assert not np.array_equal(blocks, whole)


def test_a_block_across_the_boundary_is_split_there(model, small_threshold, monkeypatch):
    """A call that holds the prompt's end and tokens after it: the prompt's part in blocks, the rest as one-token
    sequences; its rows are those of the prompt fed alone and then the rest fed alone."""
    session = model.session()
    prompt, after = _tokens(3, 60, model.vocab_size), _tokens(4, 5, model.vocab_size)
    session.end_prompt(prompt)
    sequences = []
    real = session.infer_sequences
    monkeypatch.setattr(session, "infer_sequences", lambda t, r: sequences.append(len(t)) or real(t, r))
    calls = spy_block_sizes(session, monkeypatch)
    whole = session.feed(prompt + after, rows=len(after) + 3)
    assert sequences == [len(after)] and calls and sum(calls) == len(prompt)
    session.reset()
    head = session.feed(prompt, rows=3)
    session.sequences_from = len(prompt)
    assert np.array_equal(whole, np.concatenate([head, session.feed(after)]))


def test_no_token_is_re_fed_after_the_boundary(model, small_threshold, monkeypatch):
    """In the sequences layout a lone token is fed alone (with pad sequences), never widened with the cached
    token before it, whatever min_block asks, nor padded with a token of its own."""
    session = model.session()
    prompt = _tokens(5, 60, model.vocab_size)
    session.feed(prompt, rows=1)
    session.end_prompt(prompt)
    session.min_block = 4
    sequences: list[list[int]] = []
    real = session.infer_sequences
    monkeypatch.setattr(session, "infer_sequences", lambda t, r: sequences.append(list(t)) or real(t, r))
    calls = spy_block_sizes(session, monkeypatch)
    step = _tokens(6, 3, model.vocab_size)
    for token in step:
        assert session.feed([token]).shape[0] == 1
    assert sequences == [[t] for t in step] and calls == []  # no block-layout call at all
    assert session.tokens == prompt + step and session.last_block == 1


def test_pads_make_more_sequences_than_threads_and_two_rows():
    assert sequence_pads(1, 1, 1) == 1 and sequence_pads(1, 1, 4) == 4 and sequence_pads(8, 8, 4) == 0
    assert sequence_pads(2, 9, 1) == 0 and sequence_pads(1, 5, 1) == 1


def test_a_new_request_reuses_only_the_prompts_part(model, small_threshold):
    """keep_prefix keeps at most the boundary's tokens, and the boundary goes; truncating to it or below clears
    it, and a rollback within the request keeps it."""
    session = model.session()
    prompt = _tokens(7, 60, model.vocab_size)
    session.feed(prompt, rows=1)
    session.end_prompt(prompt)
    answer = _tokens(8, 6, model.vocab_size)
    session.feed(answer)
    session.rollback(6)
    assert session.sequences_from == len(prompt)
    session.feed(answer)
    kept = session.keep_prefix(prompt + answer + [1, 2])
    assert kept == len(prompt) and session.sequences_from is None and session.tokens == prompt
    session.end_prompt(prompt)
    session.feed(answer)
    session.truncate(len(prompt) + 2)
    assert session.sequences_from == len(prompt)
    session.truncate(len(prompt))
    assert session.sequences_from is None


def test_the_probe_passes_and_fails_with_the_layout(model, monkeypatch):
    session = model.session()
    assert passes_sequences_layout(session, past=PAST) and session.length == 0
    real = PagedSession.infer_sequences

    def drifts(self, tokens, rows):  # a layout whose rows depend on the call's size
        return real(self, tokens, rows) + (1e-3 if len(tokens) > 3 else 0.0)
    monkeypatch.setattr(PagedSession, "infer_sequences", drifts)
    assert not passes_sequences_layout(session, past=PAST)
    assert passes_block_invariance(session)  # the block layout's check does not depend on it


def test_a_model_that_fails_the_layouts_probe_stays_exact_in_blocks(bundle_dir, monkeypatch, small_threshold):
    """open_model probes the layout on an exact CPU model, once per machine (known_sequences keeps the verdict):
    a model that fails it is still exact and its sessions keep the block layout after long prompts."""
    probed: list[bool] = []
    real_probe = session_module.passes_sequences_layout
    monkeypatch.setattr(session_module, "passes_sequences_layout",
                        lambda s: probed.append(True) or real_probe(s))
    xml = load_target_xml(bundle_dir)
    known: dict = {}
    assert open_model(xml, known_invariant={"dq": True}, known_longest={"dq": 64}, known_sequences=known).sequences
    assert known == {"dq": True} and len(probed) == 1
    assert open_model(xml, known_invariant={"dq": True}, known_longest={"dq": 64}, known_sequences=known).sequences
    assert len(probed) == 1  # from the verdict kept
    real = PagedSession.infer_sequences
    monkeypatch.setattr(PagedSession, "infer_sequences",
                        lambda self, t, r: real(self, t, r) + (1e-3 if len(t) > 3 else 0.0))
    known = {}
    failed = open_model(xml, known_invariant={}, known_longest={"dq": 64}, known_sequences=known)
    assert failed.block_invariant and failed.precision == "dq" and not failed.sequences and known == {"dq": False}
    session = failed.session()
    prompt = _tokens(40, 60, failed.vocab_size)
    session.feed(prompt, rows=1)
    session.end_prompt(prompt)
    assert session.sequences_from is None


def test_a_batched_call_gives_each_session_its_rows_alone(model, small_threshold):
    """Sessions in the sequences layout and in the block layout in one call: each gets the rows it computes
    alone, with pads only where the whole call has too few sequences."""
    pool = BlockPool(model.compiled)
    group = [model.session(pool) for _ in range(3)]
    prompts = [_tokens(10 + i, n, model.vocab_size) for i, n in enumerate((60, 70, 20))]
    for s, prompt in zip(group, prompts):
        s.feed(prompt, rows=1)
        s.end_prompt(prompt)
    assert [s.sequences_from for s in group] == [60, 70, None]
    queue = ModelQueue(group[0])
    for sizes, rows in (((1, 1, 2), (1, 1, 1)), ((3, 1, 4), (3, 1, 2)), ((5, 2, 2), (2, 2, 2)), ((1, 8, 3), (1, 8, 1))):
        blocks = [_tokens(20 + n, n, model.vocab_size) for n in sizes]
        alone = [(s.infer_sequences if s.sequences_from else s.infer_alone)(b, r)[-r:]
                 for s, b, r in zip(group, blocks, rows)]
        calls = [Call(s, b, r, sequences=s.sequences_from is not None) for s, b, r in zip(group, blocks, rows)]
        together = queue.together(calls)
        for a, t in zip(alone, together):
            assert np.array_equal(a, t), sizes
        for s, b in zip(group, blocks):
            s.tokens.extend(b)


def test_the_batching_probe_covers_the_layout(model, monkeypatch):
    """batch_invariant puts a session in the sequences layout among the others: it passes, and fails where such a
    session's rows alone are not its rows in the batched call."""
    from edge_specdec.runtime.batching import batch_invariant

    real = PagedSession.infer_sequences
    seen: list[int] = []
    monkeypatch.setattr(PagedSession, "infer_sequences", lambda self, t, r: seen.append(len(t)) or real(self, t, r))
    assert batch_invariant(model) and seen
    monkeypatch.setattr(PagedSession, "infer_sequences", lambda self, t, r: real(self, t, r) + 1e-3)
    assert not batch_invariant(model)


def test_sequences_calls_run_on_the_dynamic_model(bundle_dir, small_threshold):
    """A static copy is compiled for one number of tokens in one sequence: a call of one-token sequences never
    runs on it (its session makes no request on a copy), while a block of that size does."""
    model = open_model(load_target_xml(bundle_dir), known_invariant={"dq": True}, known_longest={"dq": 64})
    model.add_static({2, 3}, invariant=lambda session: True)
    assert set(model.static) == {2, 3}
    session = model.session()
    prompt = _tokens(30, 60, model.vocab_size)
    session.feed(prompt, rows=1)
    session.end_prompt(prompt)
    session.feed(_tokens(31, 2, model.vocab_size))
    session.feed(_tokens(32, 3, model.vocab_size))
    assert session._static == {}
    session.truncate(len(prompt))  # the boundary goes: blocks again
    session.feed(_tokens(31, 2, model.vocab_size))
    assert set(session._static) == {2}
