"""Runs after a long prompt (session.py, "One-token sequences"; the threshold made small here): the target alone and
every drafting algorithm feed each position after the prompt as one-token sequences, so their output is the same,
token ids and logprob bits; a sampled run's logprobs are the target alone's, teacher-forced with the same boundary;
a conversation's next turn reuses its cache only up to the last prompt's end and writes what a fresh session
writes."""
from __future__ import annotations

import numpy as np
import pytest

import edge_specdec.runtime.session as session_module
from edge_specdec.runtime import Engine, GenerationConfig
from edge_specdec.runtime.chat import ChatTemplate
from edge_specdec.runtime.sampling import penalize, token_logprobs
from edge_specdec.runtime.session import PagedSession
from support import OTHER_VOCAB, SAME_VOCAB, bits, pipeline_cache

THRESHOLD = 48
PROMPT = ("def parse(text):\n    \"\"\"Split the text into words.\"\"\"\n    words = []\n"
          "    for word in text.split():\n        words.append(word.strip())\n    return words\n\n") * 2 + "def "
GREEDY = GenerationConfig(max_new_tokens=16, ignore_eos=True, logprobs=True, top_logprobs=2)
CHAT = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>\n{% endfor %}" \
       "{% if add_generation_prompt %}<assistant>{% endif %}"


@pytest.fixture
def small_threshold(monkeypatch):
    monkeypatch.setattr(session_module, "SEQUENCES_AFTER", THRESHOLD)


@pytest.fixture(scope="module")
def engines(bundle_dir):
    return pipeline_cache(bundle_dir, Engine)


def _count_sequence_calls(monkeypatch) -> list[int]:
    sizes: list[int] = []
    real = PagedSession.infer_sequences
    monkeypatch.setattr(PagedSession, "infer_sequences",
                        lambda self, tokens, rows: sizes.append(len(tokens)) or real(self, tokens, rows))
    return sizes


@pytest.mark.parametrize("pair,algorithm", [(SAME_VOCAB, "standard"), (SAME_VOCAB, "prompt-lookup"),
                                            (OTHER_VOCAB, "slem"), (OTHER_VOCAB, "tli")])
def test_greedy_drafting_writes_the_target_alones_ids_and_bits(engines, pair, algorithm, small_threshold,
                                                               monkeypatch):
    engine = engines(pair)
    prompt = engine.tokenizer.encode(PROMPT)
    assert len(prompt) >= THRESHOLD
    calls = _count_sequence_calls(monkeypatch)
    session = engine.session()
    alone = session.generate(prompt, GREEDY, algorithm="none")
    assert session.target.sequences_from == len(prompt) and calls and max(calls) == 1
    drafted = engine.session().generate(prompt, GREEDY, algorithm=algorithm, num_assistant_tokens=4, confidence=0.0,
                                        pool_scope=None)
    assert max(calls) > 1  # verification blocks went as one-token sequences too
    assert drafted.token_ids == alone.token_ids and bits(drafted.logprobs) == bits(alone.logprobs)
    assert drafted.stats.draft_tokens_proposed + drafted.stats.free_tokens_proposed > 0


def test_a_run_reserved_up_front_keeps_its_pool_at_the_runs_size(engines, small_threshold):
    """The pads' scratch block is taken before the run's blocks, so the first one-token sequences after a long
    prompt do not double a pool sized to the run (a copy of all its blocks, and memory the run never uses)."""
    session = engines(SAME_VOCAB).target_model.session()
    prompt = engines(SAME_VOCAB).tokenizer.encode(PROMPT)
    session.end_prompt(prompt)
    session.reserve(len(prompt) + 16)
    row = session.feed(prompt, rows=1)[-1]
    for _ in range(8):
        row = session.feed([int(row.argmax())], rows=1)[-1]
    assert session.sequences_from == len(prompt)
    assert len(session.blocks) == -(-(len(prompt) + 16) // session.block_size)
    assert session.pool.capacity == len(session.blocks) + 1  # the run's blocks and the scratch block


def test_a_short_prompt_keeps_the_block_layout(engines, small_threshold, monkeypatch):
    engine = engines(SAME_VOCAB)
    calls = _count_sequence_calls(monkeypatch)
    session = engine.session()
    session.generate(engine.tokenizer.encode("def f(x):"), GREEDY, algorithm="standard")
    assert session.target.sequences_from is None and calls == []


def _forced(engine, prompt: list[int], tokens: list[int], config) -> list:
    """The target alone's logprobs of `tokens` after `prompt`, in one feed from scratch, with the boundary a run
    on that prompt has."""
    session = engine.session().target
    session.end_prompt(prompt)
    rows = session.feed(prompt + tokens, rows=len(tokens) + 1)[:-1]
    return token_logprobs(penalize(rows, config, prompt, tokens), tokens, config)


def check_sampled_against_teacher_forcing(engine, algorithm: str) -> None:
    """Sampled runs of `algorithm` on the long prompt, two seeds: their logprobs are the target alone's bits,
    teacher-forced on the tokens they wrote."""
    prompt = engine.tokenizer.encode(PROMPT)
    for seed in range(2):
        config = GenerationConfig(max_new_tokens=16, temperature=0.9, top_p=0.95, seed=seed, ignore_eos=True,
                                  logprobs=True, top_logprobs=2)
        result = engine.session().generate(prompt, config, algorithm=algorithm, num_assistant_tokens=4,
                                           confidence=0.0)
        assert bits(result.logprobs) == bits(_forced(engine, prompt, result.token_ids, config))


@pytest.mark.parametrize("pair,algorithm", [(SAME_VOCAB, "standard"), (OTHER_VOCAB, "tli")])
def test_sampled_logprobs_are_the_target_alones_teacher_forced(engines, pair, algorithm, small_threshold):
    check_sampled_against_teacher_forcing(engines(pair), algorithm)


def test_teacher_forcing_without_the_boundary_gives_other_bits(engines, small_threshold):
    """The layout changes a row's bits: a check that ignored the boundary would not see a wrong one."""
    engine = engines(SAME_VOCAB)
    prompt = engine.tokenizer.encode(PROMPT)
    result = engine.session().generate(prompt, GREEDY, algorithm="none")
    plain = engine.session().target
    rows = plain.feed(prompt + result.token_ids, rows=len(result.token_ids) + 1)[:-1]
    assert bits(token_logprobs(rows, result.token_ids, GREEDY)) != bits(result.logprobs)


@pytest.mark.parametrize("pair,algorithm", [(SAME_VOCAB, "standard"), (OTHER_VOCAB, "slem")])
def test_a_conversations_next_turn_after_a_long_prompt_reuses_the_answer_and_is_a_fresh_sessions(
        bundle_dir, pair, algorithm, small_threshold):
    """The one-token sequences start after the first turn past the threshold, in every later prompt too (session.py,
    "A chat's turns"): a later turn reuses the whole cache, the answers fed in that layout too."""
    engine = Engine(bundle_dir(*pair))
    engine.__dict__["chat_template"] = ChatTemplate(CHAT)  # the tiny tokenizers have none of their own
    chat = engine.start_chat(system="be brief")
    assert chat.session.target.answer_opening == engine.answer_opening != ()
    config = GenerationConfig(max_new_tokens=10, ignore_eos=True, logprobs=True)
    first = chat.ask(PROMPT, config, algorithm=algorithm)
    first_prompt = len(chat.ids) - len(chat._tokens_of(first))
    assert first_prompt >= THRESHOLD and chat.session.target.sequences_from == first_prompt
    for turn in ("now the tests", "and a docstring"):
        fed = len(chat.ids) - 1  # the last prompt and its answer but the answer's last token, never fed
        result = chat.ask(turn, config, algorithm=algorithm)
        prompt = chat.ids[:len(chat.ids) - len(chat._tokens_of(result))]
        assert chat.session.target.sequences_from == first_prompt
        fresh = engine.session().generate(prompt, config, algorithm=algorithm)
        assert result.token_ids == fresh.token_ids and bits(result.logprobs) == bits(fresh.logprobs), turn
        assert result.stats.prompt_tokens_reused == fed, turn


def test_a_batching_engine_writes_what_a_session_alone_writes(bundle_dir, engines, small_threshold):
    """Two sessions after long prompts and one after a short one, generating at once on a batching engine: each
    writes what it writes alone (their one-token sequences and the other's blocks in shared calls)."""
    from test_batching import run_clients

    reference = engines(OTHER_VOCAB)
    prompts = [reference.tokenizer.encode(PROMPT), reference.tokenizer.encode(PROMPT + "merge("),
               reference.tokenizer.encode("def f(x):")]
    jobs = [(p, GREEDY, "slem") for p in prompts]
    alone = [reference.session().generate(p, c, algorithm=a) for p, c, a in jobs]
    engine = Engine(bundle_dir(*OTHER_VOCAB), batching=True)
    assert engine.scheduler is not None, engine.batching_note
    got = run_clients(engine, jobs, join_running=True)
    for a, g in zip(alone, got):
        assert g.token_ids == a.token_ids and bits(g.logprobs) == bits(a.logprobs)
    assert engine.scheduler.stats()["batched_calls"] > 0


def test_after_a_long_prompt_the_first_round_is_the_targets_prefill_alone(engines, small_threshold, monkeypatch):
    """Its first token waits neither for the draft model's prefill nor for a copy's verification: the first round
    proposes nothing (the prompt repeats itself, so a copy is there to take); after a short prompt the first round
    drafts."""
    import edge_specdec.runtime.generate as generate_module

    engine = engines(OTHER_VOCAB)
    lengths: list[int] = []
    real = generate_module.draft
    monkeypatch.setattr(generate_module, "draft",
                        lambda r, seq, k, free=0: lengths.append(k + free) or real(r, seq, k, free))
    config = GenerationConfig(max_new_tokens=12, ignore_eos=True)
    engine.session().generate(engine.tokenizer.encode(PROMPT), config, algorithm="slem", num_assistant_tokens=4,
                              confidence=0.0)
    assert lengths[0] == 0, lengths
    lengths.clear()
    engine.session().generate(engine.tokenizer.encode("def f(x):"), config, algorithm="slem",
                              num_assistant_tokens=4, confidence=0.0)
    assert lengths[0] > 0, lengths
