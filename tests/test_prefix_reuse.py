"""Prefix reuse: a session keeps its KV caches between runs, and a run that reuses a prefix writes what a fresh
session writes on the same prompt (token ids and logprob bits)."""
from __future__ import annotations

import numpy as np
import pytest

from edge_specdec.errors import EdgeSpecdecError
from edge_specdec.runtime import Engine, GenerationConfig
from edge_specdec.runtime.pipeline import DRAFT_TOKENS
from edge_specdec.runtime.text import decode
from support import OTHER_VOCAB, SAME_VOCAB, pipeline_cache

ALGORITHMS = [(SAME_VOCAB, "none"), (SAME_VOCAB, "standard"), (SAME_VOCAB, "prompt-lookup"),
              (OTHER_VOCAB, "slem"), (OTHER_VOCAB, "tli"), (OTHER_VOCAB, "slrs")]
FIRST = "def parse(text):\n    \"\"\"Split the text into words, émoji 🙂 included.\"\"\"\n    words = []\n"
GREEDY = GenerationConfig(max_new_tokens=12, ignore_eos=True, logprobs=True, top_logprobs=2)


def bits(result) -> list:
    return [(lp.token, np.float64(lp.logprob).view(np.int64),
             [(t, np.float64(v).view(np.int64)) for t, v in lp.top]) for lp in result.logprobs]


def second_prompts(engine, first_ids: list[int], answer: list[int]) -> dict[str, list[int]]:
    """Prompts that share none, part, all but one token of the first prompt, or extend it with its answer (a chat
    turn)."""
    other = engine.tokenizer.encode("class Stack:\n    def push(self, item):\n")
    more = engine.tokenizer.encode("\n# and now the tests\n")
    return {"nothing": other, "part": first_ids[:len(first_ids) // 2] + other,
            "all but one": first_ids[:-1] + other[:1], "the same": list(first_ids),
            "with its answer": first_ids + answer + more}


@pytest.fixture(scope="module")
def engines(bundle_dir):
    """engines(pair, **options) -> an Engine, built once per module."""
    return pipeline_cache(bundle_dir, Engine)


# every algorithm on the default engine (the exactness core); on f32 without static copies, the same-vocabulary
# draft in the fast tier and the others in the slow one
@pytest.mark.parametrize("options,pair,algorithm",
                         [pytest.param({"precision": "dq"}, *run, marks=pytest.mark.core, id=f"dq-static-{run[1]}")
                          for run in ALGORITHMS]
                         + [pytest.param({"precision": "f32", "static_shapes": False}, *run,
                                         marks=() if run[1] == "standard" else pytest.mark.slow,
                                         id=f"f32-dynamic-{run[1]}") for run in ALGORITHMS])
def test_a_reused_prefix_writes_what_a_fresh_session_writes(engines, pair, algorithm, options):
    engine = engines(pair, **options)
    kept = engine.session()
    first_ids = engine.tokenizer.encode(FIRST)
    first = kept.generate(first_ids, GREEDY, algorithm=algorithm)
    assert first.stats.prompt_tokens_reused == 0
    for case, prompt in second_prompts(engine, first_ids, first.token_ids).items():
        fresh = engine.session().generate(prompt, GREEDY, algorithm=algorithm)
        cached = list(kept.target.tokens)
        again = kept.generate(prompt, GREEDY, algorithm=algorithm)
        assert again.token_ids == fresh.token_ids, case
        assert bits(again) == bits(fresh), case
        shared = next((i for i, (a, b) in enumerate(zip(cached, prompt)) if a != b), min(len(cached), len(prompt)))
        assert again.stats.prompt_tokens_reused == min(shared, len(prompt) - 1), case


def test_a_chat_turn_prefills_only_what_is_new(engines, monkeypatch):
    """In the second turn no call of the target or of the draft (another vocabulary) feeds more than the new
    text and a round's block: neither prefills the conversation again."""
    engine = engines(OTHER_VOCAB)
    session = engine.session()
    first_ids = engine.tokenizer.encode(FIRST)
    first = session.generate(first_ids, GREEDY, algorithm="slem")
    calls = {"target": [], "draft": []}
    for role, sizes in calls.items():
        model_session = getattr(session, role)
        monkeypatch.setattr(model_session, "_infer", lambda tokens, rows, _infer=model_session._infer, _sizes=sizes:
                            _sizes.append(len(tokens)) or _infer(tokens, rows))
    new = engine.tokenizer.encode("\n# next\n")
    turn = first_ids + first.token_ids + new
    second = session.generate(turn, GREEDY, algorithm="slem")
    assert second.stats.prompt_tokens_reused == len(first_ids) + len(first.token_ids) - 1
    round_block = 2 * (DRAFT_TOKENS + 1)  # a verification block, widened, with the re-fed token before it
    assert max(calls["target"]) <= len(new) + round_block < len(turn)
    draft_turn = engine.draft_retokenizer.encode(decode(engine.vocab_map.target, turn))
    assert calls["draft"] and max(calls["draft"]) < len(draft_turn) // 2


def test_a_prompt_that_diverges_inside_a_multibyte_character(engines):
    engine = engines(OTHER_VOCAB)
    kept = engine.session()
    kept.generate("# café 🙂 and more", GREEDY, algorithm="slem")
    for text in ("# café 🙃 and less", "# cafè", "# café 🙂 and more, then"):
        fresh = engine.session().generate(text, GREEDY, algorithm="slem")
        again = kept.generate(text, GREEDY, algorithm="slem")
        assert again.token_ids == fresh.token_ids and bits(again) == bits(fresh), text


@pytest.mark.core
@pytest.mark.parametrize("options", [{"batching": True}, {"concurrent": True}], ids=["batching", "concurrent"])
def test_reuse_holds_on_batching_engines_and_with_concurrent_drafting(engines, options):
    engine = engines(OTHER_VOCAB, **options)
    reference = engines(OTHER_VOCAB)
    kept = engine.session()
    first_ids = engine.tokenizer.encode(FIRST)
    first = kept.generate(first_ids, GREEDY, algorithm="slem")
    for case, prompt in second_prompts(engine, first_ids, first.token_ids).items():
        fresh = reference.session().generate(prompt, GREEDY, algorithm="slem")
        again = kept.generate(prompt, GREEDY, algorithm="slem")
        assert again.token_ids == fresh.token_ids and bits(again) == bits(fresh), case


def test_a_seeded_sampled_run_reproduces_after_reuse(engines):
    engine = engines(SAME_VOCAB)
    config = GenerationConfig(max_new_tokens=12, temperature=0.8, top_k=40, seed=5, ignore_eos=True)
    kept = engine.session()
    first = kept.generate(FIRST, config, algorithm="standard")
    turn = engine.tokenizer.encode(FIRST) + first.token_ids
    fresh = engine.session().generate(turn, config, algorithm="standard")
    again = kept.generate(turn, config, algorithm="standard")
    assert again.stats.prompt_tokens_reused > 0 and again.token_ids == fresh.token_ids


def test_reuse_off_feeds_the_whole_prompt(engines):
    engine = engines(SAME_VOCAB, prefix_reuse=False)
    session = engine.session()
    session.generate(FIRST, GREEDY, algorithm="standard")
    again = session.generate(FIRST, GREEDY, algorithm="standard")
    assert again.stats.prompt_tokens_reused == 0


def test_a_target_that_is_not_block_invariant_starts_over_and_says_so(engines):
    engine = engines(SAME_VOCAB, kv_rollback="masked")
    session = engine.session()
    session.generate(FIRST, GREEDY, algorithm="standard")
    again = session.generate(FIRST, GREEDY, algorithm="standard")
    assert again.stats.prompt_tokens_reused == 0 and "not block-invariant" in again.extra["prefix_reuse"]


@pytest.mark.slow  # the only test of the fast tier's that would export the GPT-2-tokenizer draft's bundle
@pytest.mark.parametrize("algorithm", ["slem", "tli", "slrs", "auto"])
def test_a_prompt_of_special_tokens_only_gives_the_target_alones_tokens(bundle_dir, engines, algorithm):
    """A draft tokenizer that adds no BOS sees no tokens at all in such a prompt: the draft sits out the rounds
    until the output gives it text."""
    engine = engines(("qwen2-bytelevel", "gpt2-prefixspace", "int8", "int8"))
    eos = engine.bundle.target.eos_token_ids[0]
    config = GenerationConfig(max_new_tokens=10, ignore_eos=True, logprobs=True)
    alone = engine.session().generate([eos], config, algorithm="none")
    spec = engine.session().generate([eos], config, algorithm=algorithm)
    assert spec.token_ids == alone.token_ids and bits(spec) == bits(alone)


@pytest.mark.parametrize("ids", [[700], [-1], [5, 10**6]])
def test_prompt_token_ids_out_of_range_are_refused(engines, ids):
    engine = engines(OTHER_VOCAB)
    with pytest.raises(EdgeSpecdecError, match="not a token of the target"):
        engine.session().generate(ids, GREEDY, algorithm="slem")
