"""A long prompt's prefill on a copy of the target at another precision (session.py, "A long prompt's prefill in
bf16"; the threshold made small here): the target alone and every algorithm prefill a long prompt but its last token
alike on the copy, in calls of at least PREFILL_LEAST tokens, and its last token on the target, so they write the same
token ids and logprob bits; the copy computes the cache only; a later request reuses a cache only where its prompt is
prefilled the same way; a copy the CPU cannot run or that fails its probe (on the cache its calls write) is dropped
and says why. bf16 where the CPU computes it, else f32 (the same machinery, on a CPU without bf16)."""
from __future__ import annotations

import time

import numpy as np
import openvino as ov
import pytest

from edge_specdec.errors import EdgeSpecdecError
from edge_specdec.runtime import Engine, EngineConfig, GenerationConfig
from edge_specdec.runtime.chat import ChatTemplate
from edge_specdec.runtime import prefill_blocks
from edge_specdec.runtime.prefill_blocks import bf16_as_f16
from edge_specdec.runtime.probes import (CONTEXT_ROOM, REAL_PAST, passes_prefill_calls, prefill_copy_ratio,
                                        written_cache)
from edge_specdec.runtime import session as session_module
from edge_specdec.runtime.session import (CPU_CAPABILITY, PREFILL_ALIGN, PREFILL_CALL_SIZES, PREFILL_LEAST,
                                          PREFILL_OUTPUT_IDS, SEQUENCES_AFTER, BlockPool, ModelSession, PagedSession,
                                          open_model)
from edge_specdec.serve.prefix_store import PrefixStore
from support import OTHER_VOCAB, SAME_VOCAB, bits
# the long-prompt runs' prompt, settings and fixtures (the threshold made small), and sampled runs checked against
# teacher forcing with the boundary (and so the prefill copy) a run on the prompt has
from test_sequences_generate import (CHAT, GREEDY, PROMPT, THRESHOLD, check_sampled_against_teacher_forcing,  # noqa
                                     engines, small_threshold)

HAS_BF16 = "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
PRECISION = "bf16" if HAS_BF16 else "f32"


def _prefill_calls(monkeypatch) -> list[int]:
    """The sizes of the calls that run on the prefill copy, from now on."""
    sizes: list[int] = []
    real = PagedSession.infer_alone

    def spy(self, tokens, rows):
        if self.prefilling:
            sizes.append(len(tokens))
        return real(self, tokens, rows)
    monkeypatch.setattr(PagedSession, "infer_alone", spy)
    return sizes


def test_the_engine_keeps_the_copy_and_says_so(engines):
    engine = engines(SAME_VOCAB, long_prompt_precision=PRECISION)
    assert engine.target_model.prefill is not None, engine.target_model.prefill_note
    assert engine.target_model.prefill_precision == PRECISION and PRECISION in engine.long_prompt_note
    assert engines(SAME_VOCAB).target_model.prefill is None and engines(SAME_VOCAB).long_prompt_note == ""


def test_the_copy_computes_the_cache_and_the_target_the_prompts_last_row(engines, small_threshold, monkeypatch):
    """The copy holds no second output layer (its logits have PREFILL_OUTPUT_IDS columns, never read); the prompt's
    last token is the first one-token sequence on the target, whose row gives the first token."""
    engine = engines(SAME_VOCAB, long_prompt_precision=PRECISION)
    target = engine.target_model
    assert target.prefill.output("logits").get_partial_shape()[-1].get_length() == PREFILL_OUTPUT_IDS
    assert target.compiled.output("logits").get_partial_shape()[-1].get_length() == target.vocab_size
    prompt = engine.tokenizer.encode(PROMPT)
    sequences: list[tuple[int, list[int]]] = []
    real = PagedSession.infer_sequences

    def spy(self, tokens, rows):
        sequences.append((self.length, list(tokens)))
        return real(self, tokens, rows)
    monkeypatch.setattr(PagedSession, "infer_sequences", spy)
    session = engine.session()
    session.generate(prompt, GREEDY, algorithm="none")
    assert session.target.sequences_from == len(prompt) - 1
    assert sequences[0] == (len(prompt) - 1, prompt[-1:])
    # a caller that asks for rows of the prompt the copy computed is told so
    fresh = engine.session().target
    fresh.end_prompt(prompt)
    with pytest.raises(ValueError, match="computes the cache only"):
        fresh.feed(prompt, rows=2)


@pytest.mark.parametrize("pair,algorithm", [(SAME_VOCAB, "standard"), (SAME_VOCAB, "prompt-lookup"),
                                            (OTHER_VOCAB, "slem"), (OTHER_VOCAB, "tli")])
def test_greedy_drafting_writes_the_target_alones_ids_and_bits(engines, pair, algorithm, small_threshold,
                                                               monkeypatch):
    engine = engines(pair, long_prompt_precision=PRECISION)
    prompt = engine.tokenizer.encode(PROMPT)
    assert len(prompt) >= THRESHOLD
    calls = _prefill_calls(monkeypatch)
    alone = engine.session().generate(prompt, GREEDY, algorithm="none")
    assert sum(calls) >= len(prompt) - 1 and min(calls) >= PREFILL_LEAST  # the prompt but its last token: the copy
    calls.clear()
    drafted = engine.session().generate(prompt, GREEDY, algorithm=algorithm, num_assistant_tokens=4, confidence=0.0,
                                        pool_scope=None)
    assert sum(calls) >= len(prompt) - 1 and min(calls) >= PREFILL_LEAST
    assert drafted.token_ids == alone.token_ids and bits(drafted.logprobs) == bits(alone.logprobs)
    assert drafted.stats.draft_tokens_proposed + drafted.stats.free_tokens_proposed > 0


@pytest.mark.parametrize("count,longest,align,sizes", [
    (2047, 256, 128, [256] * 7 + [255]),
    (2047, 1024, 128, [1024, 1023]),
    (4102, 1024, 128, [1024] * 3 + [896, 134]),  # a rest of 6 takes 128 tokens of the last whole piece
    (4102, 256, 128, [256] * 15 + [128, 134]),  # a rest of 6 takes 128 tokens of the last whole piece
    (600, 384, 128, [384, 216]),
    (600, 300, 128, [256, 256, 88]),  # the largest multiple of 128 up to 300
    (250, 256, 128, [250]),  # one call holds them
    (600, 256, 1, [200, 200, 200]),  # no alignment: even pieces
    (600, 130, 128, [120] * 5),  # no room for a multiple and a rest: even pieces
])
def test_the_copys_pieces_are_aligned_and_their_rest_holds_its_fewest_tokens(count, longest, align, sizes):
    pieces = ModelSession._aligned_pieces(list(range(count)), longest, align)
    assert [len(piece) for piece in pieces] == sizes and sum(pieces, []) == list(range(count))


def test_the_copy_feeds_a_long_prompt_in_aligned_pieces_that_write_what_even_pieces_write(engines, small_threshold,
                                                                                          monkeypatch):
    engine = engines(SAME_VOCAB, long_prompt_precision=PRECISION)
    model = engine.target_model
    prompt = engine.tokenizer.encode(PROMPT * 3)
    head = len(prompt) - 1  # the tokens the copy prefills
    whole, rest = divmod(head, model.prefill_longest)
    # pieces of prefill_longest (a multiple of the alignment) and a rest long enough to stand alone, which falls short
    # of a multiple of the alignment by a few tokens: it is padded up to that multiple
    assert whole >= 1 and rest >= PREFILL_LEAST and 0 < -rest % PREFILL_ALIGN <= 8, head
    assert model.prefill_longest >= 2 * PREFILL_ALIGN and model.prefill_longest % PREFILL_ALIGN == 0
    calls = _prefill_calls(monkeypatch)
    aligned = engine.session().generate(prompt, GREEDY, algorithm="none")
    assert calls == [model.prefill_longest] * whole + [-(-rest // PREFILL_ALIGN) * PREFILL_ALIGN]
    calls.clear()
    monkeypatch.setattr(model, "prefill_align", 1)
    even = engine.session().generate(prompt, GREEDY, algorithm="none")
    assert len(calls) == whole + 1 and sum(calls) == head  # even pieces, none padded
    assert aligned.token_ids == even.token_ids and bits(aligned.logprobs) == bits(even.logprobs)


def _prompt_leaving_the_copy(engine, rest: int) -> list[int]:
    """A prompt whose part on the prefill copy (all but its last token) is one call of prefill_longest tokens and a
    rest of `rest` tokens."""
    model = engine.target_model
    prompt = engine.tokenizer.encode(PROMPT * 4)[:model.prefill_longest + rest + 1]
    assert len(prompt) == model.prefill_longest + rest + 1
    return prompt


@pytest.mark.parametrize("rest,call", [
    (125, 128),  # 3 short of a multiple of 128: padded up to it
    (72, 128),  # 56 short (7/16 of the alignment): padded
    (71, 71),  # more than that short: not padded
    (40, 40),
    (200, 256),
])
def test_the_copys_last_call_is_padded_up_to_its_alignment_where_it_falls_just_short(engines, small_threshold,
                                                                                     monkeypatch, rest, call):
    """The pad tokens lie after the call's own and are forgotten: the run writes the ids and logprob bits a run
    without pads writes."""
    engine = engines(SAME_VOCAB, long_prompt_precision=PRECISION)
    model = engine.target_model
    assert model.prefill_longest == 2 * PREFILL_ALIGN == 256
    prompt = _prompt_leaving_the_copy(engine, rest)
    calls = _prefill_calls(monkeypatch)
    padded = engine.session().generate(prompt, GREEDY, algorithm="none")
    assert calls == [model.prefill_longest, call]
    calls.clear()
    monkeypatch.setattr(session_module, "PREFILL_PAD_MOST", 0.0)
    unpadded = engine.session().generate(prompt, GREEDY, algorithm="none")
    assert calls == [model.prefill_longest, rest]
    assert padded.token_ids == unpadded.token_ids and bits(padded.logprobs) == bits(unpadded.logprobs)


def test_a_request_for_one_new_token_reserves_room_for_the_copys_pad(engines, small_threshold, monkeypatch):
    """A fresh session holds blocks for the prompt and the new tokens asked for; the copy's last call is padded all the
    same, into blocks the run took for it."""
    engine = engines(SAME_VOCAB, long_prompt_precision=PRECISION)
    model = engine.target_model
    prompt = _prompt_leaving_the_copy(engine, 200)  # a rest of 200: padded to 256
    calls = _prefill_calls(monkeypatch)
    session = engine.session()
    result = session.generate(prompt, GenerationConfig(max_new_tokens=1), algorithm="none")
    assert calls == [model.prefill_longest, 256] and len(result.token_ids) == 1
    assert session.target.length == len(prompt)  # the pads were forgotten


@pytest.mark.parametrize("rest,pad", [(200, 56), (125, 3), (72, 56), (71, 0), (40, 0)])
def test_the_room_a_run_reserves_for_the_copys_pad_is_its_last_calls_own(engines, small_threshold, rest, pad):
    engine = engines(SAME_VOCAB, long_prompt_precision=PRECISION)
    model = engine.target_model
    prompt = _prompt_leaving_the_copy(engine, rest)
    session = model.session()
    session.end_prompt(prompt)
    assert session.copy_end == len(prompt) - 1 and session.prefill_reach == session.copy_end + pad
    session.feed(prompt[:model.prefill_longest])  # a prompt's first piece in the cache (a reused prefix)
    assert session.prefill_reach == session.copy_end + pad
    session.begin_long_prefill()  # no prompt's end: no pad to reserve for
    assert session.prefill_reach == 0


@pytest.mark.parametrize("head,longest,room,calls,unpadded", [
    (352, 256, 384, [256, 128], [256, 96]),  # a rest of 96, padded to 128: the blocks held reach that far
    (352, 256, 352, [256, 96], [256, 96]),  # the blocks held end before the pads' end: not padded
    (240, 256, 256, [256], [240]),  # one call, padded
    (240, 250, 256, [240], [240]),  # a call of 256 is longer than the copy's probe covers: not padded
])
def test_the_copy_pads_a_call_only_into_blocks_the_session_holds_and_up_to_its_longest_call(
        engines, small_threshold, monkeypatch, head, longest, room, calls, unpadded):
    engine = engines(SAME_VOCAB, long_prompt_precision=PRECISION)
    model = engine.target_model
    tokens = engine.tokenizer.encode(PROMPT * 3)[:head]
    sizes = _prefill_calls(monkeypatch)
    caches = []
    for pad_most in (session_module.PREFILL_PAD_MOST, 0.0):  # then without pads, to compare what they write
        monkeypatch.setattr(session_module, "PREFILL_PAD_MOST", pad_most)
        monkeypatch.setattr(model, "prefill_longest", longest)
        session = model.session()
        session.end_prompt(tokens + [0])
        session.reserve(room)
        held = len(session.blocks)
        assert held * session.block_size == room  # the blocks held end where the case says
        sizes.clear()
        session.feed(tokens, rows=1)
        assert sizes == (calls if pad_most else unpadded)
        assert session.length == head and len(session.blocks) == held  # the pads took no block
        caches.append(written_cache(session, 0, head))
    assert all(np.array_equal(a, b) for a, b in zip(*caches))


def test_a_short_prompt_is_not_prefilled_on_the_copy(engines, small_threshold, monkeypatch):
    engine = engines(SAME_VOCAB, long_prompt_precision=PRECISION)
    calls = _prefill_calls(monkeypatch)
    session = engine.session()
    session.generate(engine.tokenizer.encode("def f(x):"), GREEDY, algorithm="standard")
    assert calls == [] and not session.target.prefilled_long


def test_the_copy_computes_other_bits_than_the_target(engines, small_threshold):
    """What the copy computes reaches the output (a run that ignored the copy would pass the tests above too)."""
    if not HAS_BF16:
        pytest.skip("this CPU has no bf16 arithmetic: its f32 copy may compute the dq target's bits")
    prompt = engines(SAME_VOCAB).tokenizer.encode(PROMPT)
    plain = engines(SAME_VOCAB).session().generate(prompt, GREEDY, algorithm="none")
    copied = engines(SAME_VOCAB, long_prompt_precision="bf16").session().generate(prompt, GREEDY, algorithm="none")
    assert bits(plain.logprobs) != bits(copied.logprobs)


@pytest.mark.parametrize("pair,algorithm", [(SAME_VOCAB, "standard"), (OTHER_VOCAB, "tli")])
def test_sampled_logprobs_are_the_target_alones_teacher_forced(engines, pair, algorithm, small_threshold):
    check_sampled_against_teacher_forcing(engines(pair, long_prompt_precision=PRECISION), algorithm)


def test_the_copy_runs_on_the_sessions_own_blocks(engines, small_threshold, monkeypatch):
    """No second set of KV blocks for the copy: one pool, the session's, that its request reads as bf16 where the
    copy computes bf16 (the target's blocks are f16)."""
    engine = engines(SAME_VOCAB, long_prompt_precision=PRECISION)
    pools: list[tuple[BlockPool, ov.CompiledModel]] = []  # each pool made, and the model it was made for
    real = BlockPool.__init__
    monkeypatch.setattr(BlockPool, "__init__",
                        lambda self, compiled: pools.append((self, compiled)) or real(self, compiled))
    session = engine.session()
    session.generate(engine.tokenizer.encode(PROMPT), GREEDY, algorithm="none")
    assert session.target.prefilled_long
    assert [pool for pool, compiled in pools if compiled is engine.target_model.compiled] == [session.target.pool]
    assert not [pool for pool, compiled in pools if compiled is engine.target_model.prefill]
    assert engine.target_model.prefill_reads_as == (ov.Type.bf16 if HAS_BF16 else None)


def test_the_target_reads_the_copys_values_cast_to_f16_and_a_later_prefill_the_copys_bits(engines, small_threshold):
    """What the copy wrote is converted in place for the target (the prompt's last token reads it); a later request
    that goes on prefilling on the copy after it gets the copy's bits back, the values f16 cannot hold among them
    (put into the copy's blocks here: the tiny model writes none; the conversation test above checks that such a
    turn equals a fresh session)."""
    if not HAS_BF16:
        pytest.skip("this CPU has no bf16 arithmetic: its f32 copy writes the target's f16 blocks, with nothing to "
                    "convert")
    engine = engines(SAME_VOCAB, long_prompt_precision=PRECISION)
    prompt = engine.tokenizer.encode(PROMPT)
    longer = prompt + engine.tokenizer.encode("    return [w for w in words if w]\n\ndef ")
    session = engine.target_model.session()
    session.end_prompt(prompt)
    session.feed(prompt[:-1], rows=1)  # the copy's calls
    # bf16 values f16 holds only as 0, as a subnormal, or as infinities, in the first and a later block
    edges = np.asarray([0x0001, 0x3380, 0x3701, 0x4780, 0xFF80, 0x7FC1], np.uint16).view(np.float16)
    for name in session.pool.names:
        data = session.pool.tensors[name].data
        data[session.blocks[0], 0, 0, :len(edges)] = edges
        data[session.blocks[1], -1, 1, -len(edges):] = edges
    written = written_cache(session, 0, len(prompt) - 1)
    session.feed(prompt[-1:], rows=1)  # the target's first one-token sequence
    cast = [bf16_as_f16(w.view(np.uint16)).view(np.uint8) for w in written]
    assert all(np.array_equal(a, b) for a, b in zip(written_cache(session, 0, len(prompt) - 1), cast))
    assert session.keep_prefix(longer) == len(prompt) - 1
    session.end_prompt(longer)
    session.feed(longer[len(prompt) - 1:-1], rows=1)  # the copy again, after what it wrote for the first prompt
    assert all(np.array_equal(a, b) for a, b in zip(written_cache(session, 0, len(prompt) - 1), written))


def _failing_copy_call(monkeypatch, after: int) -> None:
    """Make the prefill copy's calls fail from the (after + 1)-th on, once its blocks are handed over to it."""
    calls = []
    real = PagedSession._inputs

    def fail(self, request, n, used, rows):
        if request is self._prefill:
            calls.append(n)
            if len(calls) > after:
                raise RuntimeError("a failing call")
        return real(self, request, n, used, rows)
    monkeypatch.setattr(PagedSession, "_inputs", fail)


def test_a_cache_restored_after_a_prefill_cut_short_is_read_as_written(engines, small_threshold, monkeypatch):
    """A long prompt's prefill fails after the copy's first call; the server's prefix store then restores a short
    prompt's cache (the target's f16 values) into that slot: the run reads it as it was written, and writes what a
    fresh session writes."""
    engine = engines(SAME_VOCAB, long_prompt_precision=PRECISION)
    prompt = engine.tokenizer.encode(PROMPT * 3)  # more than one call on the copy
    assert len(prompt) - 1 > engine.target_model.prefill_longest
    short = engine.tokenizer.encode("def f(x):\n    return x + 1\n")
    store = PrefixStore(max_bytes=1 << 30, min_tokens=4)
    donor = engine.session()
    donor.generate(short, GREEDY, algorithm="none")
    assert store.prepare(donor, engine.tokenizer.encode("x = 1")).stored
    slot = engine.session()
    with monkeypatch.context() as patch:
        _failing_copy_call(patch, after=1)
        with pytest.raises(RuntimeError, match="a failing call"):
            slot.generate(prompt, GREEDY, algorithm="none")
    assert store.prepare(slot, short + short[:3]).restored
    result = slot.generate(short + short[:3], GREEDY, algorithm="none")
    fresh = engine.session().generate(short + short[:3], GREEDY, algorithm="none")
    assert result.token_ids == fresh.token_ids and bits(result.logprobs) == bits(fresh.logprobs)


def test_a_copy_call_that_fails_after_the_hand_over_leaves_no_mixed_cache(engines, small_threshold, monkeypatch):
    """A later long prompt's first call on the copy fails after the blocks were converted back for it; the first
    prompt again, whose cached part all goes to the target, then writes what a fresh session writes."""
    engine = engines(SAME_VOCAB, long_prompt_precision=PRECISION)
    prompt = engine.tokenizer.encode(PROMPT)
    session = engine.session()
    session.generate(prompt, GREEDY, algorithm="none")
    longer = prompt + engine.tokenizer.encode("    return [w for w in words if w]\n\ndef ")
    with monkeypatch.context() as patch:
        _failing_copy_call(patch, after=0)
        with pytest.raises(RuntimeError, match="a failing call"):
            session.generate(longer, GREEDY, algorithm="none")
    result = session.generate(prompt, GREEDY, algorithm="none")  # all the copy wrote is kept: no call on it
    fresh = engine.session().generate(prompt, GREEDY, algorithm="none")
    assert result.token_ids == fresh.token_ids and bits(result.logprobs) == bits(fresh.logprobs)


def test_batched_sessions_prefill_long_prompts_on_their_shared_pool(engines, small_threshold):
    """Two sessions of a batching engine (one block pool, one scheduler) on long prompts at once: each writes the
    target alone's tokens and bits of an engine without batching."""
    import threading
    batching = engines(SAME_VOCAB, long_prompt_precision=PRECISION, batching=True)
    plain = engines(SAME_VOCAB, long_prompt_precision=PRECISION)
    prompts = [plain.tokenizer.encode(PROMPT), plain.tokenizer.encode(PROMPT.replace("words", "parts"))]
    results: dict[int, object] = {}

    def run(i: int) -> None:
        results[i] = batching.session().generate(prompts[i], GREEDY, algorithm="standard", num_assistant_tokens=3)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i, prompt in enumerate(prompts):
        alone = plain.session().generate(prompt, GREEDY, algorithm="none")
        assert results[i].token_ids == alone.token_ids and bits(results[i].logprobs) == bits(alone.logprobs)


def test_while_other_sessions_generate_the_copys_calls_hold_at_most_its_shared_longest(engines, small_threshold,
                                                                                     monkeypatch):
    """A call on the copy runs alone and holds the blocks' lock: while another session of a batching engine
    generates, its calls hold at most PREFILL_SHARED_LONGEST tokens (128 here), and write the same ids and bits."""
    batching = engines(SAME_VOCAB, long_prompt_precision=PRECISION, batching=True)
    monkeypatch.setattr(session_module, "PREFILL_SHARED_LONGEST", 128)
    prompt = batching.tokenizer.encode(PROMPT * 3)
    calls = _prefill_calls(monkeypatch)
    alone = batching.session().generate(prompt, GREEDY, algorithm="none")
    assert max(calls) == batching.target_model.prefill_longest == 256
    calls.clear()
    with batching.scheduler.generating():  # another session, counted as generating
        shared = batching.session().generate(prompt, GREEDY, algorithm="none")
    assert max(calls) == 128 and sum(calls) >= len(prompt) - 1
    assert shared.token_ids == alone.token_ids and bits(shared.logprobs) == bits(alone.logprobs)


def test_a_kv_cache_the_copy_cannot_write_keeps_no_copy_and_says_so(bundle_dir):
    """A bf16 copy writes two bytes a value into the target's blocks, and the CPU plugin refuses it an f32 cache."""
    if not HAS_BF16:
        pytest.skip("this CPU has no bf16 arithmetic: the bf16 copy is dropped before its cache is looked at")
    model = open_model(bundle_dir(*SAME_VOCAB) / "target" / "openvino_model.xml", "CPU", prefill_precision="bf16",
                       kv_cache="f32", known_prefill={})
    assert model.block_invariant and model.prefill is None
    assert "bf16 copy does not compile" in model.prefill_note and "--kv-cache f16" in model.prefill_note


def test_a_copy_whose_cache_is_the_targets_type_runs_on_the_blocks_as_they_are(bundle_dir):
    """An f32 copy keeps the f16 cache it is asked for: nothing to convert."""
    model = open_model(bundle_dir(*SAME_VOCAB) / "target" / "openvino_model.xml", "CPU", prefill_precision="f32",
                       known_prefill={})
    assert model.prefill is not None and model.prefill_reads_as is None


def test_a_conversations_turns_reuse_a_cache_prefilled_as_their_prompt_is(bundle_dir, small_threshold):
    """A short first turn (dq), then a long one (a document: prefilled on the copy up to its end), then short
    questions: the long turn reuses nothing of the short one's cache (the copy prefills the positions the target
    wrote), the questions reuse the whole cache, answers too (the copy's end stays where the document's turn ended);
    each turn equals a fresh session on its prompt (session.py, "A chat's turns")."""
    engine = Engine(bundle_dir(*SAME_VOCAB), long_prompt_precision=PRECISION)
    engine.__dict__["chat_template"] = ChatTemplate(CHAT)  # the tiny tokenizers have none of their own
    chat = engine.start_chat(system="be brief")
    config = GenerationConfig(max_new_tokens=10, ignore_eos=True, logprobs=True)
    first = chat.ask("hi", config, algorithm="standard")
    assert len(chat.ids) < THRESHOLD and not chat.session.target.prefilled_long and first.token_ids
    reused_expected, copy_end = 0, None  # the short turn's cache was written by the target, not the copy
    for turn in (PROMPT, "now the tests", "and a docstring"):
        result = chat.ask(turn, config, algorithm="standard")
        prompt = chat.ids[:len(chat.ids) - len(chat._tokens_of(result))]
        target = chat.session.target
        copy_end = copy_end or len(prompt) - 1  # the document's turn: the copy wrote all but its last token
        assert len(prompt) >= THRESHOLD and target.copy_end == target.sequences_from == copy_end
        fresh = engine.session().generate(prompt, config, algorithm="standard")
        assert result.token_ids == fresh.token_ids and bits(result.logprobs) == bits(fresh.logprobs), turn
        assert result.stats.prompt_tokens_reused == reused_expected, turn
        reused_expected = len(chat.ids) - 1  # all the run fed: its prompt, and its answer but the last token


def test_a_short_prompt_after_a_long_one_reuses_nothing_of_its_cache(engines, small_threshold):
    engine = engines(SAME_VOCAB, long_prompt_precision=PRECISION)
    prompt = engine.tokenizer.encode(PROMPT)
    session = engine.session()
    session.generate(prompt, GREEDY, algorithm="none")
    short = prompt[:THRESHOLD - 8]  # shares its tokens with the long prompt's cache, which the copy wrote
    assert session.target.shared_prefix(short) == 0
    result = session.generate(short, GREEDY, algorithm="none")
    fresh = engine.session().generate(short, GREEDY, algorithm="none")
    assert result.stats.prompt_tokens_reused == 0
    assert result.token_ids == fresh.token_ids and bits(result.logprobs) == bits(fresh.logprobs)
    # on the engine without the copy the same short prompt reuses the long prompt's blocks
    plain = engines(SAME_VOCAB).session()
    plain.generate(prompt, GREEDY, algorithm="none")
    assert plain.target.shared_prefix(short) == len(short)


def test_the_prefix_store_keeps_a_cache_the_copy_wrote_for_prompts_prefilled_the_same_way(engines, small_threshold):
    """A stored cache the copy wrote goes with its layout and what converting its values kept aside: a prompt that
    starts with its tokens but is prefilled otherwise (a short one) restores none of it; one that continues it
    does, and writes what a fresh session writes."""
    engine = engines(SAME_VOCAB, long_prompt_precision=PRECISION)
    prompt = engine.tokenizer.encode(PROMPT)
    store = PrefixStore(max_bytes=1 << 30, min_tokens=4)
    slot = engine.session()
    slot.generate(prompt, GREEDY, algorithm="none")
    layout, tokens = slot.target.cache_layout, list(slot.target.tokens)
    written, kept = slot.target.copy_state
    assert layout[0] > 0 and kept is not None and kept.positions == layout[0]  # converted for the target's rows
    assert store.prepare(slot, engine.tokenizer.encode("x = 1")).stored
    slot.generate(engine.tokenizer.encode("x = 1"), GREEDY, algorithm="none")
    assert not store.prepare(slot, prompt[:THRESHOLD - 8]).restored  # its head, but the target would write it
    assert store.prepare(slot, prompt).restored
    assert slot.target.tokens == tokens and slot.target.cache_layout == layout
    assert slot.target.copy_state[0] == written and slot.target.copy_state[1].positions == kept.positions
    longer = prompt + engine.tokenizer.encode(" words(text):\n    return text.split()\n")
    restored = slot.generate(longer, GREEDY, algorithm="none")  # a longer prompt: the copy goes on from the cache
    fresh = engine.session().generate(longer, GREEDY, algorithm="none")
    assert restored.token_ids == fresh.token_ids and bits(restored.logprobs) == bits(fresh.logprobs)
    assert restored.stats.prompt_tokens_reused == layout[0]


@pytest.fixture
def many_kept_aside(monkeypatch):
    """The values the bf16-to-f16 conversion keeps aside (prefill_blocks.py) made many: all those under 2^-4 in
    magnitude, not only those under 2^-17, which the tiny models' caches do not hold. The target reads the same f16
    values either way; the way back puts more of the copy's own bits in again."""
    monkeypatch.setattr(prefill_blocks, "EXACT_FROM", (127 - 4) << 7)
    prefill_blocks._tables.cache_clear()
    yield
    prefill_blocks._tables.cache_clear()


def test_a_stored_cache_with_values_kept_aside_is_restored_into_another_slots_blocks(bundle_dir, small_threshold,
                                                                                      many_kept_aside):
    """The kept-aside values are placed by their order in the block table: restored into another slot of a batching
    engine (other blocks of the shared pool), the copy goes on prefilling after them as a fresh session does."""
    if not HAS_BF16:
        pytest.skip("this CPU has no bf16 arithmetic: its f32 copy writes the target's element type, nothing is "
                    "converted or kept aside")
    engine = Engine(bundle_dir(*SAME_VOCAB), long_prompt_precision=PRECISION, batching=True)
    prompt = engine.tokenizer.encode(PROMPT)
    store = PrefixStore(max_bytes=1 << 30, min_tokens=4)
    first_slot, second_slot = engine.session(), engine.session()
    assert first_slot.target.pool is second_slot.target.pool, engine.batching_note
    second_slot.generate(engine.tokenizer.encode("x = 1"), GREEDY, algorithm="none")  # it holds blocks of its own
    first_slot.generate(prompt, GREEDY, algorithm="none")
    kept = first_slot.target.copy_state[1]
    assert kept is not None and kept.count > 100
    table = list(first_slot.target.blocks)
    assert store.prepare(first_slot, engine.tokenizer.encode("y = 2")).stored
    longer = prompt + engine.tokenizer.encode(" words(text):\n    return text.split()\n")
    assert store.prepare(second_slot, longer).restored
    assert second_slot.target.blocks[:len(table)] != table and second_slot.target.copy_state[1].count == kept.count
    restored = second_slot.generate(longer, GREEDY, algorithm="none")  # the copy goes on after the restored cache
    fresh = engine.session().generate(longer, GREEDY, algorithm="none")
    assert restored.token_ids == fresh.token_ids and bits(restored.logprobs) == bits(fresh.logprobs)
    assert restored.stats.prompt_tokens_reused == len(prompt) - 1


def test_a_cpu_without_the_precision_keeps_no_copy(monkeypatch, bundle_dir):
    """A CPU that computes f32 where bf16 is asked (no AMX, no AVX-512 BF16): no copy, and the note says why."""
    real = ov.CompiledModel.get_property

    def f32_only(self, name):
        value = real(self, name)
        return ov.Type.f32 if name == "INFERENCE_PRECISION_HINT" and str(value) == str(ov.Type.bf16) else value
    monkeypatch.setattr(ov.CompiledModel, "get_property", f32_only)
    model = open_model(bundle_dir(*SAME_VOCAB) / "target" / "openvino_model.xml", "CPU", prefill_precision="bf16",
                       known_prefill={})
    assert model.block_invariant and model.prefill is None
    assert "no bf16 arithmetic" in model.prefill_note


def test_a_copy_that_failed_its_probe_is_not_used(bundle_dir):
    known = {PRECISION: False}  # as an earlier process on this machine found it
    model = open_model(bundle_dir(*SAME_VOCAB) / "target" / "openvino_model.xml", "CPU",
                       prefill_precision=PRECISION, known_prefill=known)
    assert model.prefill is None and "other rows" in model.prefill_note


def test_the_probe_passes_on_the_copy_and_its_verdict_is_kept(bundle_dir):
    known: dict = {}
    model = open_model(bundle_dir(*SAME_VOCAB) / "target" / "openvino_model.xml", "CPU",
                       prefill_precision=PRECISION, known_prefill=known)
    assert model.prefill is not None and known == {PRECISION: model.prefill_longest}
    # the longest call tried (no context given: the probe tests it whole), which the tiny target passes; the
    # prefill's pieces may be longer than the target's
    assert model.prefill_longest == max(PREFILL_CALL_SIZES) > model.longest_block


@pytest.mark.parametrize("passing,kept", [(1024, 1024), (512, 256), (256, 256), (100, 64), (4, None)])
def test_the_copys_calls_hold_the_longest_size_its_probe_passes_with(bundle_dir, monkeypatch, passing, kept):
    """The probe tries PREFILL_CALL_SIZES and the target's longest block (64 here), longest first, and keeps the
    first it passes with; a copy that passes none is dropped."""
    tried = []

    def probe(session, longest):
        tried.append(longest)
        return longest <= passing
    monkeypatch.setattr(session_module, "passes_prefill_calls", probe)
    model = open_model(bundle_dir(*SAME_VOCAB) / "target" / "openvino_model.xml", "CPU", known_longest={"dq": 64},
                       prefill_precision=PRECISION, known_prefill={})
    sizes = [1024, 256, 64]
    assert PREFILL_CALL_SIZES == (1024, 256) and model.longest_block == 64
    assert tried == (sizes[:sizes.index(kept) + 1] if kept else sizes)
    assert model.prefill_longest == (kept or 0) and (model.prefill is None) == (kept is None)


@pytest.mark.parametrize("context,tried", [(None, [1024, 256, 64]), (REAL_PAST + 1024 + CONTEXT_ROOM, [1024, 256, 64]),
                                           (REAL_PAST + 1023 + CONTEXT_ROOM, [256, 64]), (512, [256, 64]),
                                           (REAL_PAST + 63 + CONTEXT_ROOM, [])])
def test_the_probe_tries_only_the_calls_it_can_test_whole_in_the_context(bundle_dir, monkeypatch, context, tried):
    """A call is tried only where the context holds it after the probe's real prefill (probes.REAL_PAST tokens):
    a shorter context would cut the probe's call and pasts, and its verdict would cover calls it never made."""
    sizes = []
    monkeypatch.setattr(session_module, "passes_prefill_calls", lambda session, longest: sizes.append(longest))
    model = open_model(bundle_dir(*SAME_VOCAB) / "target" / "openvino_model.xml", "CPU", known_longest={"dq": 64},
                       max_context=context, prefill_precision=PRECISION, known_prefill={})
    assert sizes == tried and model.prefill is None  # (the fake probe passes none)
    assert ("too short to probe" in model.prefill_note) == (not tried), model.prefill_note


def test_the_probe_fails_a_copy_whose_calls_write_other_cache_bits(engines, monkeypatch):
    """The probe compares the cache the copy's calls write (all the copy computes): a copy whose one call of them
    all wrote other bits than its smaller calls fails it."""
    engine = engines(SAME_VOCAB, long_prompt_precision=PRECISION)
    session = engine.target_model.session()
    assert passes_prefill_calls(session, engine.target_model.prefill_longest)
    real = PagedSession.infer_alone

    def long_calls_differ(self, tokens, rows):
        logits = real(self, tokens, rows)
        if self.prefilling and len(tokens) > 34:  # longer than the probe's short calls: its first slot differs
            pool, table = self.pool, self.blocks
            block, slot = table[self.length // pool.block_size], self.length % pool.block_size
            data = pool.tensors[pool.names[-1]].data
            data[block, 0, slot, 0] = -data[block, 0, slot, 0] if data[block, 0, slot, 0] else 1
        return logits
    monkeypatch.setattr(PagedSession, "infer_alone", long_calls_differ)
    assert not passes_prefill_calls(session, engine.target_model.prefill_longest)


def test_an_unknown_precision_is_refused_where_it_is_set():
    with pytest.raises(EdgeSpecdecError, match="long_prompt_precision"):
        EngineConfig(long_prompt_precision="fp8")


@pytest.fixture
def auto_on_tiny(monkeypatch):
    """The default ("auto") made to consider the tiny target, at this CPU's copy precision; the copy's timing
    replaced by a ratio the test sets (what it returns: the ratio, the count of timings, each one's prompt length)."""
    monkeypatch.setattr(session_module, "AUTO_PREFILL", PRECISION)
    monkeypatch.setattr(session_module, "AUTO_PREFILL_BYTES", 0)
    timing = {"ratio": 0.5, "calls": 0, "tokens": []}

    def timed(session, tokens, reps=1):
        timing["calls"] += 1
        timing["tokens"].append(tokens)
        return timing["ratio"]
    monkeypatch.setattr(session_module, "prefill_copy_ratio", timed)
    return timing


def _compiles(monkeypatch) -> list[str]:
    """The INFERENCE_PRECISION_HINT of every model compiled from now on."""
    hints: list[str] = []
    real = ov.Core.compile_model

    def spy(self, model, device=None, config=None):
        hints.append(str((config or {}).get("INFERENCE_PRECISION_HINT")))
        return real(self, model, device, config)
    monkeypatch.setattr(ov.Core, "compile_model", spy)
    return hints


def test_auto_keeps_the_copy_where_it_prefills_fast_enough(bundle_dir, auto_on_tiny):
    known, times = {}, {}
    model = open_model(bundle_dir(*SAME_VOCAB) / "target" / "openvino_model.xml", "CPU", prefill_precision="auto",
                       known_prefill=known, known_prefill_ratio=times)
    assert model.prefill is not None and model.prefill_precision == PRECISION
    assert known == {PRECISION: model.prefill_longest} and times == {PRECISION: 0.5} and auto_on_tiny["calls"] == 1
    again = open_model(bundle_dir(*SAME_VOCAB) / "target" / "openvino_model.xml", "CPU", prefill_precision="auto",
                       known_prefill=known, known_prefill_ratio=times)
    assert again.prefill is not None and auto_on_tiny["calls"] == 1  # timed once per machine and bundle


@pytest.mark.parametrize("max_context", [None, 512, 1400])
def test_auto_times_the_copy_on_a_prompt_of_two_of_its_calls_or_what_the_context_holds(bundle_dir, auto_on_tiny,
                                                                                        max_context):
    """A prompt of one call would leave out what a long prompt's later calls cost (attention over a past as long as
    a call), where bf16 gains most on CPUs without AMX."""
    model = open_model(bundle_dir(*SAME_VOCAB) / "target" / "openvino_model.xml", "CPU", prefill_precision="auto",
                       max_context=max_context, known_prefill={}, known_prefill_ratio={})
    [tokens] = auto_on_tiny["tokens"]
    assert model.prefill is not None and tokens > model.prefill_longest
    if max_context is None:
        assert tokens == 2 * model.prefill_longest
    else:
        assert tokens == min(2 * model.prefill_longest, max_context - CONTEXT_ROOM)


def test_auto_drops_a_copy_too_slow_to_pay_and_compiles_none_once_it_knows(bundle_dir, auto_on_tiny, monkeypatch):
    auto_on_tiny["ratio"] = 0.97  # over AUTO_PREFILL_RATIO
    xml = bundle_dir(*SAME_VOCAB) / "target" / "openvino_model.xml"
    known, times = {}, {}
    model = open_model(xml, "CPU", prefill_precision="auto", known_prefill=known, known_prefill_ratio=times)
    assert session_module.AUTO_PREFILL_RATIO < 0.97
    assert model.prefill is None and model.prefill_longest == 0 and times[PRECISION] == 0.97
    assert "0.97x the target's time" in model.prefill_note
    assert f"--long-prompt-precision {PRECISION} keeps it" in model.prefill_note
    hints = _compiles(monkeypatch)
    again = open_model(xml, "CPU", prefill_precision="auto", known_prefill=known, known_prefill_ratio=times)
    assert again.prefill is None and "the target's time" in again.prefill_note
    assert hints == [hints[0]] and auto_on_tiny["calls"] == 1  # the target only: no copy compiled, none timed


@pytest.mark.parametrize("why", ["small", "f32 cache", "no such arithmetic", "failed probe"])
def test_auto_compiles_no_copy_where_it_cannot_pay(bundle_dir, auto_on_tiny, monkeypatch, why):
    xml = bundle_dir(*SAME_VOCAB) / "target" / "openvino_model.xml"
    settings: dict = {"known_prefill": {}, "known_prefill_ratio": {}}
    if why == "small":
        monkeypatch.setattr(session_module, "AUTO_PREFILL_BYTES", xml.with_suffix(".bin").stat().st_size + 1)
    elif why == "f32 cache":
        settings["kv_cache"] = "f32"
    elif why == "no such arithmetic":
        real = ov.Core.get_property

        def without(self, *args):
            value = real(self, *args)
            return [c for c in value if c != CPU_CAPABILITY[PRECISION]] if args[-1] == "OPTIMIZATION_CAPABILITIES" \
                else value
        monkeypatch.setattr(ov.Core, "get_property", without)
    else:
        settings["known_prefill"] = {PRECISION: False}
    hints = _compiles(monkeypatch)
    model = open_model(xml, "CPU", prefill_precision="auto", **settings)
    assert model.block_invariant and model.prefill is None and len(hints) == 1 and auto_on_tiny["calls"] == 0
    assert model.prefill_note.startswith(f"no {PRECISION} prefill copy: ")
    assert {"small": "prefills quickly", "f32 cache": "f32 KV cache", "no such arithmetic": f"no {PRECISION} arith",
            "failed probe": "did not compile or pass its probe"}[why] in model.prefill_note


def test_the_default_is_auto_and_a_copy_it_does_not_keep_stays_off_the_load_line(engines):
    """The tiny target is under AUTO_PREFILL_BYTES: the default keeps no copy, says nothing at load, and `check`'s
    line says why."""
    from edge_specdec.check import long_prompt_line

    engine = engines(SAME_VOCAB)
    assert engine.config.long_prompt_precision == "auto" and engine.target_model.prefill is None
    assert engine.long_prompt_note == "" and "prefills quickly" in long_prompt_line(engine)
    kept = engines(SAME_VOCAB, long_prompt_precision=PRECISION)
    assert f"on a {PRECISION} copy" in long_prompt_line(kept)
    with pytest.raises(EdgeSpecdecError, match="long_prompt_precision"):
        EngineConfig(long_prompt_precision=None)


def test_off_keeps_no_copy_and_says_nothing(bundle_dir, auto_on_tiny, monkeypatch):
    hints = _compiles(monkeypatch)
    engine = Engine(bundle_dir(*SAME_VOCAB), long_prompt_precision="off", draft_pool_tokens=0)
    assert engine.target_model.prefill is None and engine.target_model.prefill_note == ""
    assert engine.long_prompt_note == "" and "bf16" not in hints and auto_on_tiny["calls"] == 0


def test_auto_times_the_copy_once_per_machine_and_bundle(bundle_dir, auto_on_tiny, tmp_path):
    """The timing goes into the measurement cache, and a later engine on the same machine reads it."""
    first = Engine(bundle_dir(*SAME_VOCAB), cache_dir=tmp_path, draft_pool_tokens=0)
    assert first.target_model.prefill is not None and PRECISION in first.long_prompt_note
    assert first.measurements.values["target/prefill_ratio"] == {PRECISION: 0.5}
    again = Engine(bundle_dir(*SAME_VOCAB), cache_dir=tmp_path, draft_pool_tokens=0)
    assert again.target_model.prefill is not None and auto_on_tiny["calls"] == 1


def test_auto_remembers_a_copy_the_cpu_does_not_compute_and_compiles_none_again(bundle_dir, auto_on_tiny,
                                                                                monkeypatch):
    real = ov.CompiledModel.get_property
    monkeypatch.setattr(ov.CompiledModel, "get_property", lambda self, name: ov.Type.f16
                        if name == "INFERENCE_PRECISION_HINT" else real(self, name))  # neither bf16 nor f32
    xml = bundle_dir(*SAME_VOCAB) / "target" / "openvino_model.xml"
    known, times = {}, {}
    model = open_model(xml, "CPU", prefill_precision="auto", known_prefill=known, known_prefill_ratio=times)
    assert model.prefill is None and known == {PRECISION: False} and "arithmetic" in model.prefill_note
    hints = _compiles(monkeypatch)
    again = open_model(xml, "CPU", prefill_precision="auto", known_prefill=known, known_prefill_ratio=times)
    assert again.prefill is None and len(hints) == 1 and "did not compile or pass its probe" in again.prefill_note


@pytest.mark.parametrize("precision", ["auto", PRECISION])
def test_a_target_that_is_not_exact_says_why_it_has_no_copy(bundle_dir, precision):
    model = open_model(bundle_dir(*SAME_VOCAB) / "target" / "openvino_model.xml", "CPU", kv_cache="u8",
                       prefill_precision=precision, known_prefill={}, known_prefill_ratio={})
    assert not model.block_invariant and model.prefill is None and "needs an exact paged model" in model.prefill_note


def test_the_copys_timing_compares_its_prefill_with_the_targets(bundle_dir, monkeypatch):
    """prefill_copy_ratio times the copy's calls against the target's own: a copy made slower shows it."""
    model = open_model(bundle_dir(*SAME_VOCAB) / "target" / "openvino_model.xml", "CPU", prefill_precision=PRECISION,
                       known_prefill={})
    session = model.session()
    plain = prefill_copy_ratio(session, 64, reps=1)
    assert plain > 0 and session.length == 0 and not session.prefilling
    real = PagedSession.infer_alone

    def slower_copy(self, tokens, rows):
        if self.prefilling:
            time.sleep(0.05)
        return real(self, tokens, rows)
    monkeypatch.setattr(PagedSession, "infer_alone", slower_copy)
    slowed = prefill_copy_ratio(session, 64, reps=1)
    assert slowed > plain and slowed > 1


@pytest.mark.parametrize("prompt,given,expected", [
    ("def f(x):", None, "off"),                                  # one short prompt: no copy to compile
    ("é" * (SEQUENCES_AFTER // 4 - 1), None, "off"),             # just under half as many bytes as the threshold
    ("é" * (SEQUENCES_AFTER // 4), None, "auto"),                # a prompt that might still reach it
    ("def f(x):", "bf16", "bf16"),                               # asked for by name: kept as asked
    (None, None, "auto"),                                        # a conversation: its prompts are not known
])
def test_a_one_shot_run_too_short_for_the_copy_does_not_load_it(monkeypatch, tmp_path, prompt, given, expected):
    from edge_specdec.cli import main, run as run_cli

    seen = []

    def opened(args, announce=True):
        seen.append(args.long_prompt_precision)
        raise EdgeSpecdecError("stop here")
    monkeypatch.setattr(run_cli, "open_pipeline", opened)
    args = ["run", "--chat"] if prompt is None else ["run", "--prompt-file", str(tmp_path / "p.txt")]
    if prompt is not None:
        (tmp_path / "p.txt").write_text(prompt, encoding="utf-8")
    assert main(args + (["--long-prompt-precision", given] if given else [])) == 1
    assert seen == [expected]


def test_a_prompt_under_half_the_threshold_in_bytes_stays_under_it_in_tokens(engines):
    """What a one-shot run's check relies on: a token holds at least a byte, so a chat template of up to half the
    threshold still leaves the prompt short (here the tiny tokenizer on mixed scripts, digits and whitespace)."""
    tokenizer = engines(SAME_VOCAB).tokenizer
    text = "Ünïcødé text, 数字 123 \t\n" * 60
    assert len(tokenizer.encode(text)) <= len(text.encode("utf-8"))
