"""A draft past its own context: the draft reads a window of a long sequence (its head and its last tokens, sliding
in large steps), and the output stays the target alone's, greedy (token ids and logprob bits) and sampled (its
distribution, and the logprobs of the target on the emitted ids), for a draft of the target's vocabulary and one
of another."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from edge_specdec.cli.common import stats_line
from edge_specdec.errors import EdgeSpecdecError
from edge_specdec.runtime import GenerationConfig, Pipeline, SpeculativeConfig
from edge_specdec.runtime.chat import ChatTemplate
from edge_specdec.runtime.draft_window import DRAFT_WINDOW, MIN_WINDOW, DraftWindow, chat_head_bound, chat_head_length
from edge_specdec.runtime.text import decode
from edge_specdec.serve.prefix_store import export_cache
from hostile_text import HOSTILE_STRINGS
from support import (ALPHA, N_SAMPLES, OTHER_VOCAB, SAME_VOCAB, SAMPLING, forced_logprobs, homogeneity_pvalue,
                     logprob_bits)

LONG_TEXT = "\n".join(s for s in HOSTILE_STRINGS if s.strip()) + "\ndef parse(line):\n    return line.split(',')\n"
WINDOW = 48  # far below the prompts here: the draft reads a window from the first round on
# the draft model drafts every round, whatever it earns: no free copies, no guard, no early stop
DRAFT_EVERY_ROUND = dict(lookup=False, guard=False, confidence=0.0)


def long_prompt(pipe: Pipeline, n: int) -> list[int]:
    ids = pipe.tokenizer.encode(LONG_TEXT * 8)[:n]
    assert len(ids) == n
    return ids


# --- the window itself --------------------------------------------------------------------------------------------

def test_the_window_is_the_whole_sequence_while_it_fits_then_its_head_and_tail():
    window = DraftWindow(64)
    head, tail = window.head, window.tail
    short = list(range(head + tail))
    assert window.view(short) == short and not window.stats()
    longer = list(range(head + tail + 1))
    cut = window.view(longer)
    assert cut[:head] == longer[:head] and cut[head:] == longer[window.start:]
    assert window.start == head + window.step and len(cut) <= head + tail
    assert window.slides == 1 and window.refed_tokens == len(longer) - window.start  # the tail fed again
    # the start moves only in steps: a sequence that grows by less than a step keeps it (the cache only appends)
    assert window.start_for(len(longer) + window.step - 1) == window.start
    assert window.start_for(len(longer) + window.step) == window.start + window.step
    assert window.stats()["draft_window"] == {"size": 64, "head": head, "chat_head": False, "slides": 1,
                                              "refed_tokens": window.refed_tokens}


def test_a_round_drafts_no_more_than_the_window_has_room_for():
    window = DraftWindow(32)
    assert window.most(8, 10) == 8
    assert window.most(8, 30) == 3  # 2 fed (the last drafted token is never fed) + 30 cached = 32
    assert window.most(8, 32) == 1


@pytest.mark.parametrize("bad", [-1, 1, MIN_WINDOW - 1, 2.5, True, "64"])
def test_a_draft_window_that_cannot_hold_a_head_a_tail_and_room_is_refused(bad):
    with pytest.raises(EdgeSpecdecError, match="draft_window must be 0"):
        SpeculativeConfig(draft_window=bad)


def test_the_default_window_is_the_drafts_context_when_shorter():
    assert SpeculativeConfig().window_tokens(None) == DRAFT_WINDOW
    assert SpeculativeConfig().window_tokens(512) == min(512, DRAFT_WINDOW)
    assert SpeculativeConfig(draft_window=100).window_tokens(64) == 64
    assert SpeculativeConfig(draft_window=0).window_tokens(64) is None
    assert SpeculativeConfig().window_tokens(MIN_WINDOW - 1) is None


# --- greedy: the target alone's ids and logprob bits ----------------------------------------------------------------

@pytest.mark.parametrize("pair, algorithms", [(SAME_VOCAB, ["standard"]), (OTHER_VOCAB, ["slem", "tli"])])
def test_a_windowed_draft_gives_the_target_alones_output_and_slides(cache_off_pipes, pair, algorithms):
    pipe = cache_off_pipes(pair)
    ids = long_prompt(pipe, 300)
    config = GenerationConfig(max_new_tokens=64, temperature=0, logprobs=True, ignore_eos=True)
    alone = pipe.generate(ids, config, algorithm="none")
    for algorithm in algorithms:
        run = pipe.generate(ids, config, algorithm=algorithm, draft_window=WINDOW, **DRAFT_EVERY_ROUND)
        assert run.exact and run.token_ids == alone.token_ids, algorithm
        assert logprob_bits(run) == logprob_bits(alone), algorithm
        assert run.stats.draft_tokens_proposed > 0, algorithm  # the draft drafted, on its window
        window = run.extra["draft_window"]
        assert window["size"] == WINDOW and window["slides"] >= 2 and window["refed_tokens"] > 0, algorithm
        assert pipe.draft.length <= WINDOW, algorithm
        assert f"the draft read a window of {WINDOW} tokens" in stats_line(run)


@pytest.mark.parametrize("pair, algorithm", [(SAME_VOCAB, "standard"), (OTHER_VOCAB, "slem")])
def test_a_windowed_draft_under_a_constraint_gives_the_constrained_target_alones_output(cache_off_pipes, pair, algorithm):
    """The grammar follows the whole output while the draft reads a window of it."""
    from edge_specdec.runtime.constraint import Constraint

    pipe = cache_off_pipes(pair)
    ids = long_prompt(pipe, 300)
    config = GenerationConfig(max_new_tokens=48, temperature=0, logprobs=True,
                              constraint=Constraint.regex(r"(def [a-z_]{1,12}\(\):\n    return [0-9]{1,3}\n){1,8}"))
    alone = pipe.generate(ids, config, algorithm="none")
    run = pipe.generate(ids, config, algorithm=algorithm, draft_window=WINDOW, **DRAFT_EVERY_ROUND)
    assert run.token_ids == alone.token_ids and logprob_bits(run) == logprob_bits(alone)
    assert "draft_window" in run.extra


@pytest.mark.parametrize("pair, algorithm", [(SAME_VOCAB, "standard"), (OTHER_VOCAB, "slem")])
def test_drafting_ahead_through_a_window_is_exact(bundle_dir, pair, algorithm):
    """Concurrent mode drafts the next round on a guessed sequence while the target verifies: its window is the
    same function of the sequence, and the output stays the target alone's."""
    pipe = Pipeline(bundle_dir(*pair), cache_dir="off", concurrent=True)
    ids = long_prompt(pipe, 300)
    config = GenerationConfig(max_new_tokens=64, temperature=0, logprobs=True, ignore_eos=True)
    alone = pipe.generate(ids, config, algorithm="none")
    run = pipe.generate(ids, config, algorithm=algorithm, draft_window=WINDOW, **DRAFT_EVERY_ROUND)
    assert run.token_ids == alone.token_ids and logprob_bits(run) == logprob_bits(alone)
    assert run.stats.draft_tokens_proposed > 0 and run.extra["draft_window"]["slides"] >= 2


@pytest.mark.parametrize("pair, algorithm", [(SAME_VOCAB, "standard"), (OTHER_VOCAB, "slem")])
def test_by_default_a_prompt_longer_than_the_drafts_context_is_drafted_for(bundle_dir, pair, algorithm):
    """A draft whose context (here 128 tokens) is shorter than the prompt: without a window it stops drafting at
    once (the target alone finishes the run); by default it reads a window of the draft's context and drafts, and
    the output is the target alone's either way."""
    pipe = Pipeline(bundle_dir(*pair), cache_dir="off")
    pipe.draft_model.max_context = 128
    session = pipe.session()
    assert session.draft.max_context == 128
    ids = long_prompt(pipe, 300)
    config = GenerationConfig(max_new_tokens=40, temperature=0, logprobs=True, ignore_eos=True)
    alone = session.generate(ids, config, algorithm="none")
    whole = session.generate(ids, config, algorithm=algorithm, draft_window=0, **DRAFT_EVERY_ROUND)
    assert whole.stats.draft_tokens_proposed == 0 and "draft_window" not in whole.extra
    windowed = session.generate(ids, config, algorithm=algorithm, **DRAFT_EVERY_ROUND)
    assert windowed.stats.draft_tokens_proposed > 0 and windowed.extra["draft_window"]["size"] == 128
    for run in (whole, windowed):
        assert run.token_ids == alone.token_ids and logprob_bits(run) == logprob_bits(alone)
    assert session.draft.length <= 128


def test_the_prefix_store_keeps_the_drafts_window(cache_off_pipes):
    """The draft's cache holds its window, so a copy of it (what the server's prefix store keeps) holds the window:
    the prompt's head, then its last tokens; restored into another session, a run drafts on from it, exactly."""
    from edge_specdec.serve.prefix_store import import_cache

    pipe = cache_off_pipes(SAME_VOCAB)
    ids = long_prompt(pipe, 300)
    config = GenerationConfig(max_new_tokens=24, temperature=0, ignore_eos=True)
    first = pipe.session()
    run = first.generate(ids, config, algorithm="standard", draft_window=WINDOW, **DRAFT_EVERY_ROUND)
    copy = export_cache(first.draft)
    head = DraftWindow(WINDOW).head
    assert len(copy.tokens) <= WINDOW and copy.tokens[:head] == ids[:head]
    assert copy.tokens[head:head + 4] != ids[head:head + 4]  # the middle of the prompt is not there
    second = pipe.session()
    import_cache(second.draft, export_cache(first.draft))
    import_cache(second.target, export_cache(first.target))
    again = second.generate(ids, config, algorithm="standard", draft_window=WINDOW, **DRAFT_EVERY_ROUND)
    assert again.token_ids == run.token_ids


# --- the head: the prompt's chat head where it is short, else the sequence's first tokens ---------------------------

# a template whose turns start with a special token of the tiny target (its BOS/EOS), as Qwen's and Llama's do
CHAT = ("{% for m in messages %}<|endoftext|>{{ m.role }}\n{{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|endoftext|>assistant\n{% endif %}")
SYSTEM = "Answer with code."
CHAT_WINDOW = 160  # its chat head may have up to chat_head_bound(160) = 40 tokens


def test_the_template_says_what_it_writes_before_a_user_message():
    assert ChatTemplate(CHAT).user_opening == "<|endoftext|>user\n"
    chatml = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    assert ChatTemplate(chatml).user_opening == "<|im_start|>user\n"
    # a template that always writes a system turn first (Qwen's): the end of the turn before is part of it
    default_system = "<|im_start|>system\nYou are a model.<|im_end|>\n" + chatml
    assert ChatTemplate(default_system).user_opening == "<|im_end|>\n<|im_start|>user\n"
    assert ChatTemplate("{{ messages[0]['content'] }}").user_opening is None  # no markup: no chat head


def test_the_chat_head_ends_where_the_last_user_messages_text_begins():
    spell = {1: b"<s>", 2: b"sys", 3: b"\n<u>", 4: b"hi", 5: b"\n", 6: b"<a>", 7: b"ok"}.get
    ids = [1, 2, 3, 4, 5, 6, 7, 3, 4, 5]
    assert chat_head_length(ids, spell, b"\n<u>") == 8  # the second user turn's opening ends after token 8
    assert chat_head_length(ids, spell, b"<u>") == 8     # an opening that ends inside a token
    assert chat_head_length(ids, spell, b"\n<u>hi\n<a>ok") == 7  # a token the opening's end cuts is not in the head
    assert chat_head_length(ids, spell, b"<x>") is None and chat_head_length(ids, spell, b"") is None


def test_a_short_chat_head_is_the_head_and_a_long_one_falls_back_to_the_first_tokens():
    fixed = DraftWindow(CHAT_WINDOW).head
    assert chat_head_bound(CHAT_WINDOW) == 40 and chat_head_bound(4096) == 256
    assert DraftWindow(CHAT_WINDOW, 30).head == 30 and DraftWindow(CHAT_WINDOW, 30).keeps_chat_head
    assert DraftWindow(CHAT_WINDOW, 41).head == fixed == min(64, CHAT_WINDOW // 8)
    assert not DraftWindow(CHAT_WINDOW, 41).keeps_chat_head and DraftWindow(CHAT_WINDOW, None).head == fixed
    # the start still moves in steps of half the tail, whichever head
    window = DraftWindow(CHAT_WINDOW, 30)
    assert window.tail == CHAT_WINDOW - 30 - window.room and window.step == window.tail // 2


@pytest.fixture
def chat_pipes(cache_off_pipes):
    """cache_off_pipes whose target has the CHAT template, for one test."""
    made = []

    def get(pair):
        pipe = cache_off_pipes(pair)
        pipe.__dict__["chat_template"] = ChatTemplate(CHAT)
        made.append(pipe)
        return pipe
    yield get
    for pipe in made:
        del pipe.__dict__["chat_template"]


def spelled(pipe: Pipeline, ids: list[int]) -> str:
    """The target's tokens as the template writes them (a special token by its text)."""
    return "".join(pipe.special_token_texts.get(t) or decode(pipe.vocab_map.target, [t]) for t in ids)


def chat(system: str) -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "ok"}, {"role": "user", "content": LONG_TEXT}]


@pytest.mark.parametrize("pair, algorithm", [(SAME_VOCAB, "standard"), (OTHER_VOCAB, "slem")])
def test_a_window_keeps_the_chat_head_and_the_output_is_the_target_alones(chat_pipes, pair, algorithm):
    """The window's head is the template's text before the last user message's own text: the system prompt, the
    earlier turns and the opening of the user turn; in the draft's own tokens for a draft of another vocabulary.
    Greedy, the ids and logprob bits are the target alone's; seeded sampling repeats."""
    pipe = chat_pipes(pair)
    messages = chat(SYSTEM)
    ids = pipe.chat_prompt(messages)
    rendered = pipe.chat_template.render(messages)
    head_text = rendered[:rendered.rindex(LONG_TEXT)]
    assert len(ids) > 2 * CHAT_WINDOW
    config = GenerationConfig(max_new_tokens=48, temperature=0, logprobs=True, ignore_eos=True)
    alone = pipe.generate(ids, config, algorithm="none")
    run = pipe.generate(ids, config, algorithm=algorithm, draft_window=CHAT_WINDOW, **DRAFT_EVERY_ROUND)
    assert run.token_ids == alone.token_ids and logprob_bits(run) == logprob_bits(alone)
    window = run.extra["draft_window"]
    assert window["chat_head"] and window["slides"] >= 1 and run.stats.draft_tokens_proposed > 0
    head = window["head"]
    if pair == SAME_VOCAB:  # the head is the prompt's tokens that spell the chat head
        assert spelled(pipe, ids[:head]) == head_text and ids[:head] == pipe.draft.tokens[:head]
    else:  # the draft reads the prompt's text (special tokens have none) in its own tokens (a dummy space first)
        read = decode(pipe.vocab_map.draft, pipe.draft.tokens[:head])
        assert read.removeprefix(" ") == head_text.replace("<|endoftext|>", "")
    sampled = GenerationConfig(max_new_tokens=24, seed=5, ignore_eos=True, **SAMPLED)
    again = [pipe.generate(ids, sampled, algorithm=algorithm, draft_window=CHAT_WINDOW, **DRAFT_EVERY_ROUND)
             for _ in range(2)]
    assert again[0].token_ids == again[1].token_ids and again[0].extra["draft_window"]["head"] == head


def test_a_text_prompt_has_the_chat_head_of_its_token_ids_and_the_draft_reads_its_text(chat_pipes):
    """A prompt given as the template's text: the same head in tokens as its ids', and as text the prompt's own up to
    the last user message's text (special tokens spelled), which a draft of another vocabulary reads."""
    pipe = chat_pipes(OTHER_VOCAB)
    rendered = pipe.chat_template.render(chat(SYSTEM))
    ids = pipe.tokenizer.encode(rendered)
    from_text, from_ids = pipe.chat_head(rendered, ids), pipe.chat_head(ids, ids)
    assert from_text.tokens == from_ids.tokens and from_text.text == rendered[:rendered.rindex(LONG_TEXT)]
    assert from_ids.text == from_text.text.replace("<|endoftext|>", "")  # token ids: their text, specials have none
    config = GenerationConfig(max_new_tokens=32, temperature=0, logprobs=True, ignore_eos=True)
    alone = pipe.generate(rendered, config, algorithm="none")
    # the draft spells the special tokens' text too, so its head is longer than from ids: a window that can hold it
    run = pipe.generate(rendered, config, algorithm="slem", draft_window=2 * CHAT_WINDOW, **DRAFT_EVERY_ROUND)
    assert run.token_ids == alone.token_ids and logprob_bits(run) == logprob_bits(alone)
    window = run.extra["draft_window"]
    assert window["chat_head"] and window["slides"] >= 1
    head = decode(pipe.vocab_map.draft, pipe.draft.tokens[:window["head"]])
    assert head.removeprefix(" ") == from_text.text


@pytest.mark.parametrize("pair, algorithm", [(SAME_VOCAB, "standard"), (OTHER_VOCAB, "slem")])
def test_a_chat_head_too_long_for_the_window_falls_back_to_the_first_tokens(chat_pipes, pair, algorithm):
    pipe = chat_pipes(pair)
    ids = pipe.chat_prompt(chat(SYSTEM * 8))  # a system prompt of more than chat_head_bound(CHAT_WINDOW) tokens
    plain = long_prompt(pipe, 2 * CHAT_WINDOW)  # a prompt no template wrote
    config = GenerationConfig(max_new_tokens=32, temperature=0, logprobs=True, ignore_eos=True)
    for prompt in (ids, plain):
        alone = pipe.generate(prompt, config, algorithm="none")
        run = pipe.generate(prompt, config, algorithm=algorithm, draft_window=CHAT_WINDOW, **DRAFT_EVERY_ROUND)
        assert run.token_ids == alone.token_ids and logprob_bits(run) == logprob_bits(alone)
        window = run.extra["draft_window"]
        assert not window["chat_head"] and window["head"] == DraftWindow(CHAT_WINDOW).head


# --- sampled: the target's distribution ---------------------------------------------------------------------------

SAMPLED = SAMPLING


def first_two(pipe: Pipeline, ids: list[int], algorithm: str, seeds, window=None, drafted=None) -> dict:
    """How often each pair of first tokens came out, one seeded run per seed; drafted (a list) gets each run's
    drafted token count."""
    out: dict = {}
    for seed in seeds:
        config = GenerationConfig(max_new_tokens=2, seed=seed, ignore_eos=True, **SAMPLED)
        options = dict(draft_window=window, num_assistant_tokens=3, **DRAFT_EVERY_ROUND) if window else {}
        result = pipe.generate(ids, config, algorithm=algorithm, **options)
        key = tuple(result.token_ids)
        out[key] = out.get(key, 0) + 1
        if drafted is not None:
            drafted.append(result.stats.draft_tokens_proposed)
    return out


@pytest.mark.slow  # 2 x N_SAMPLES runs
@pytest.mark.parametrize("pair, algorithm", [(SAME_VOCAB, "standard"), (OTHER_VOCAB, "tli")])
def test_sampling_through_a_window_draws_from_the_targets_distribution(cache_off_pipes, pair, algorithm):
    """The first two tokens after a prompt of 160 tokens, drafted by a draft that reads 24 of them: the same
    distribution as the target alone's (a chi-square test, as tests/test_heterogeneous.py does)."""
    pipe = cache_off_pipes(pair)
    ids = long_prompt(pipe, 160)
    drafted: list[int] = []
    base = Counter(first_two(pipe, ids, "none", range(N_SAMPLES)))
    spec = Counter(first_two(pipe, ids, algorithm, range(10_000, 10_000 + N_SAMPLES), window=24, drafted=drafted))
    assert len(base) > 5  # a distribution with several outcomes, not one token
    assert all(drafted)  # every run drafted, through its window
    assert homogeneity_pvalue(base, spec) > ALPHA


@pytest.mark.slow
def test_the_windowed_sampling_test_catches_a_broken_verifier(cache_off_pipes, monkeypatch):
    """Accepting every drafted token (ignoring p and q) yields the windowed draft's distribution, and the same test
    sees it: the test above can tell."""
    import edge_specdec.runtime.generate as gen
    from edge_specdec.runtime.sampling import distribution, sample

    def accept_everything(rows, proposal, config, rng, context, grammar=None, prompt_length=0):
        return len(proposal.tokens), sample(distribution(rows[-1], config), rng), rows

    pipe = cache_off_pipes(SAME_VOCAB)
    ids = long_prompt(pipe, 160)
    base = Counter(first_two(pipe, ids, "none", range(N_SAMPLES)))
    monkeypatch.setattr(gen, "verify", accept_everything)
    broken = Counter(first_two(pipe, ids, "standard", range(10_000, 10_000 + N_SAMPLES), window=24))
    assert homogeneity_pvalue(base, broken) < ALPHA


@pytest.mark.parametrize("pair, algorithm", [(SAME_VOCAB, "standard"), (OTHER_VOCAB, "tli")])
def test_sampled_windowed_runs_give_the_targets_logprobs_of_what_they_emit(cache_off_pipes, pair, algorithm):
    pipe = cache_off_pipes(pair)
    ids = long_prompt(pipe, 300)
    config = GenerationConfig(max_new_tokens=48, seed=3, logprobs=True, ignore_eos=True, **SAMPLED)
    run = pipe.generate(ids, config, algorithm=algorithm, draft_window=WINDOW, **DRAFT_EVERY_ROUND)
    assert run.stats.draft_tokens_proposed > 0 and run.extra["draft_window"]["slides"] >= 1
    forced = forced_logprobs(pipe, ids, run.token_ids, config)
    assert [np.float64(lp.logprob).view(np.int64) for lp in forced] == logprob_bits(run)


# --- the front ends: the command line's option and the server's extension field ----------------------------------

def test_the_command_line_and_the_server_take_a_draft_window():
    import argparse

    from edge_specdec.cli.common import add_constraint_options, add_decoding_options, decoding_settings
    from edge_specdec.serve.protocol import RequestError, _extension

    parser = argparse.ArgumentParser()
    add_decoding_options(parser)
    add_constraint_options(parser)
    assert decoding_settings(parser.parse_args(["--draft-window", "512"]))[1].draft_window == 512
    assert decoding_settings(parser.parse_args([]))[1].draft_window is None
    assert _extension({"draft_window": 0}).draft_window == 0
    with pytest.raises(RequestError, match="draft_window"):
        _extension({"draft_window": 3})
