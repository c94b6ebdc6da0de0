"""Conversations: messages rendered with the chat template, the KV caches kept between turns, each turn written
as a fresh session would write its prompt."""
from __future__ import annotations

import numpy as np
import pytest

from edge_specdec.errors import EdgeSpecdecError
from edge_specdec.runtime import Engine, GenerationConfig
from edge_specdec.runtime.chat import ChatTemplate
from support import OTHER_VOCAB, SAME_VOCAB

CHAT = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>\n{% endfor %}" \
       "{% if add_generation_prompt %}<assistant>{% endif %}"
# a template that rewrites the answers it renders (as templates that trim whitespace or drop a reasoning part do)
REWRITING = "{% for m in messages %}<{{ m.role }}>{{ '[' ~ m.content ~ ']' if m.role == 'assistant' else m.content }}" \
            "</{{ m.role }}>\n{% endfor %}" \
            "{% if add_generation_prompt %}<assistant>{% endif %}"
CONFIG = GenerationConfig(max_new_tokens=10, ignore_eos=True, logprobs=True)
TURNS = ["def add(a, b):", "now subtract", "and the tests, please"]


def engine_with(bundle_dir, pair, template: str) -> Engine:
    engine = Engine(bundle_dir(*pair))
    engine.__dict__["chat_template"] = ChatTemplate(template)  # the tiny tokenizers have none of their own
    return engine


def bits(result) -> list:
    return [np.float64(lp.logprob).view(np.int64) for lp in result.logprobs]


@pytest.mark.parametrize("pair,algorithm", [(SAME_VOCAB, "standard"), (OTHER_VOCAB, "slem")])
def test_each_turn_reuses_the_conversation_and_writes_what_a_fresh_session_writes(bundle_dir, pair, algorithm):
    engine = engine_with(bundle_dir, pair, CHAT)
    chat = engine.start_chat(system="be brief")
    before = 0
    for i, turn in enumerate(TURNS):
        result = chat.ask(turn, CONFIG, algorithm=algorithm)
        prompt = chat.ids[:len(chat.ids) - len(chat._tokens_of(result))]
        fresh = engine.session().generate(prompt, CONFIG, algorithm=algorithm)
        assert result.token_ids == fresh.token_ids and bits(result) == bits(fresh), turn
        # the turn kept everything the model had seen before it, short of the last token
        assert result.stats.prompt_tokens_reused == (before - 1 if i else 0), turn
        assert prompt[:before] == chat.ids[:before]
        before = len(chat.ids)
    assert [m["role"] for m in chat.messages] == ["system"] + ["user", "assistant"] * len(TURNS)
    assert chat.messages[-1]["content"] == result.text


def test_answers_keep_their_generated_tokens(bundle_dir):
    """The next prompt holds the answer's tokens as generated, even where the tokenizer would split its text
    otherwise, so the cache serves the whole conversation."""
    engine = engine_with(bundle_dir, SAME_VOCAB, CHAT)
    chat = engine.start_chat()
    first = chat.ask(TURNS[0], CONFIG, algorithm="standard")
    kept = chat._tokens_of(first)
    assert kept == first.token_ids[:len(kept)] and len(kept) >= len(first.token_ids) - 1
    chat.add("user", TURNS[1])
    prompt = chat.prompt_ids()
    assert prompt[:len(chat.ids)] == chat.ids and chat.ids[len(chat.ids) - len(kept):] == kept
    assert len(prompt) > len(chat.ids)


def test_a_template_that_rewrites_answers_falls_back_to_its_rendering(bundle_dir):
    engine = engine_with(bundle_dir, SAME_VOCAB, REWRITING)
    chat = engine.start_chat()
    chat.ask(TURNS[0], CONFIG, algorithm="standard")
    chat.add("user", TURNS[1])
    assert chat.prompt_ids() == engine.chat_prompt(chat.messages)
    second = chat.answer(CONFIG, algorithm="standard")
    fresh = engine.session().generate(engine.chat_prompt(chat.messages[:-1]), CONFIG, algorithm="standard")
    assert second.token_ids == fresh.token_ids and bits(second) == bits(fresh)
    assert second.stats.prompt_tokens_reused > 0  # the system of tags before the first answer is still shared


def test_a_stop_string_cut_keeps_only_the_tokens_of_the_answer(bundle_dir):
    engine = engine_with(bundle_dir, SAME_VOCAB, CHAT)
    chat = engine.start_chat()
    full = engine.session().generate(engine.chat_prompt([{"role": "user", "content": TURNS[0]}]),
                                     GenerationConfig(max_new_tokens=10, ignore_eos=True), algorithm="none")
    stop = full.text[3:5]
    result = chat.ask(TURNS[0], GenerationConfig(max_new_tokens=10, ignore_eos=True, stop_strings=[stop]))
    assert result.stop_reason == "stop_string" and stop not in result.text
    assert result.text.startswith(chat._text_of(chat._tokens_of(result)))
    assert len(chat._tokens_of(result)) < len(result.token_ids)


def test_reset_starts_over_with_the_system_message(bundle_dir):
    engine = engine_with(bundle_dir, SAME_VOCAB, CHAT)
    chat = engine.start_chat(system="sys")
    chat.ask(TURNS[0], CONFIG)
    chat.reset()
    assert chat.messages == [{"role": "system", "content": "sys"}] and chat.ids == []


def test_a_bundle_without_a_template_cannot_chat(bundle_dir):
    with pytest.raises(EdgeSpecdecError, match="no chat template"):
        Engine(bundle_dir(*SAME_VOCAB)).start_chat()
