"""A chat's turns (session.py, "A chat's turns"; the long-prompt threshold made small here): where each position of
a prompt is fed (on the long-prompt prefill copy, in blocks, or as one-token sequences) depends only on the tokens up
to the end of its turn, so a conversation's later turns reuse the whole cache, answers too, and write what a fresh
session writes on their prompt; the server's prefix store keeps a cache with its layout."""
from __future__ import annotations

import pytest

from edge_specdec.runtime import Engine, GenerationConfig
from edge_specdec.runtime.chat import ChatTemplate
from edge_specdec.runtime.session import COPY_TURN_SHARE, PagedSession, answer_starts
from edge_specdec.serve.prefix_store import PrefixStore
from support import SAME_VOCAB, bits
from test_long_prompt_prefill import PRECISION, _prefill_calls
from test_sequences_generate import CHAT, PROMPT, THRESHOLD, engines, small_threshold  # noqa: F401 (fixtures)

OPENING = (7, 8)  # a made-up answer opening, in the tests of layout() on token lists
CONFIG = GenerationConfig(max_new_tokens=10, ignore_eos=True, logprobs=True)


def test_answer_starts_are_the_openings_last_tokens_and_the_prompts_last_token():
    assert answer_starts([1, 2, 3], OPENING) == [2]
    assert answer_starts([1, 7, 8, 5, 7, 5, 8, 7, 8, 4], OPENING) == [2, 8, 9]
    assert answer_starts([7, 8, 1, 7, 8], OPENING) == [1, 4]  # an opening that ends the prompt is its last token
    assert answer_starts([8, 7], OPENING) == [1]
    assert answer_starts([7, 8, 1], ()) == [2]  # no opening known: one turn


def _turns(*lengths: int) -> list[int]:
    """A prompt of turns of these lengths, each ending with OPENING (filler tokens 1 before it)."""
    tokens: list[int] = []
    for n in lengths:
        tokens += [1] * (n - len(OPENING)) + list(OPENING)
    return tokens


@pytest.fixture
def sessions(engines, small_threshold):
    """A target session without the prefill copy and one with it, both knowing OPENING."""
    made = []
    for options in ({}, {"long_prompt_precision": PRECISION}):
        session = engines(SAME_VOCAB, **options).session().target
        session.answer_opening = OPENING
        made.append(session)
    return made


def test_a_prompt_of_one_turn_keeps_the_layout_of_its_length(sessions):
    plain, copying = sessions
    assert plain.layout([1] * (THRESHOLD - 1)) == (0, None) == copying.layout([1] * (THRESHOLD - 1))
    assert plain.layout([1] * THRESHOLD) == (0, THRESHOLD)  # the sequences start after the prompt
    assert copying.layout([1] * THRESHOLD) == (THRESHOLD - 1, THRESHOLD - 1)  # its last token is the first one


def test_a_turn_keeps_its_layout_as_later_turns_come(sessions):
    plain, copying = sessions
    document = _turns(THRESHOLD + 10)
    end = len(document) - 1
    for later in ([], [5], [5, 5, 30]):  # questions after the document: each turn under COPY_TURN_SHARE of it
        prompt = document + _turns(*later) if later else document
        assert plain.layout(prompt) == (0, end + 1)
        assert copying.layout(prompt) == (end, end)


def test_short_turns_that_grow_past_the_threshold_start_the_sequences_after_the_first_turn_past_it(sessions):
    plain, copying = sessions
    prompt = _turns(*[10] * (THRESHOLD // 10 + 3))
    first_past = next(end for end in answer_starts(prompt, OPENING) if end + 1 >= THRESHOLD)
    assert plain.layout(prompt) == (0, first_past + 1)
    assert copying.layout(prompt) == (0, first_past + 1)  # no turn holds most of the prompt: no copy


def test_a_turn_that_holds_most_of_the_prompt_moves_the_copys_end_to_it(sessions):
    _, copying = sessions
    document = _turns(THRESHOLD + 10)
    share = int(COPY_TURN_SHARE * 100)
    big = -(-len(document) * share // (100 - share))  # a turn just long enough to hold the share, and one shorter
    assert copying.layout(document + _turns(big)) == (len(document) + big - 1,) * 2
    assert copying.layout(document + _turns(big - 2)) == (len(document) - 1,) * 2


def test_the_chat_templates_answer_opening_is_what_its_generation_prompt_adds():
    chatml = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    assert ChatTemplate(chatml).answer_opening == "<|im_start|>assistant\n"
    assert ChatTemplate(CHAT).answer_opening == "<assistant>"
    assert ChatTemplate("{% for m in messages %}{{ m.content }}\n{% endfor %}").answer_opening is None


def _chat(engine: Engine):
    engine.__dict__["chat_template"] = ChatTemplate(CHAT)  # the tiny tokenizers have none of their own
    chat = engine.start_chat(system="be brief")
    assert chat.session.target.answer_opening == engine.answer_opening != ()
    return chat


def _ask_and_check(engine: Engine, chat, text: str):
    """A turn, checked against a fresh session on its prompt; the turn's result and prompt."""
    result = chat.ask(text, CONFIG, algorithm="standard")
    prompt = chat.ids[:len(chat.ids) - len(chat._tokens_of(result))]
    fresh = engine.session().generate(prompt, CONFIG, algorithm="standard")
    assert result.token_ids == fresh.token_ids and bits(result.logprobs) == bits(fresh.logprobs), text
    return result, prompt


def test_a_chat_that_grows_past_the_threshold_in_short_turns_reuses_its_whole_cache(bundle_dir, small_threshold,
                                                                                     monkeypatch):
    """On an engine with the prefill copy: the turn that crosses the threshold prefills only its own tokens, in
    blocks (not the whole conversation again on the copy), and the later turns' answers go as one-token
    sequences from the end of that turn on."""
    engine = Engine(bundle_dir(*SAME_VOCAB), long_prompt_precision=PRECISION)
    chat = _chat(engine)
    on_copy = _prefill_calls(monkeypatch)
    crossed = None
    for text in ("hi", "and then?", "why so?", "go on", "more", "and more", "the end"):
        fed = len(chat.ids) - 1 if chat.ids else 0
        result, prompt = _ask_and_check(engine, chat, text)
        assert result.stats.prompt_tokens_reused == fed, text
        if len(prompt) >= THRESHOLD and crossed is None:
            crossed = len(prompt)
        target = chat.session.target
        assert target.copy_end == 0 and target.sequences_from == crossed, text
    assert crossed is not None and on_copy == []


def test_a_document_pasted_into_a_long_chat_moves_the_copys_end_and_reprefills_from_the_old_one(
        bundle_dir, small_threshold, monkeypatch):
    engine = Engine(bundle_dir(*SAME_VOCAB), long_prompt_precision=PRECISION)
    chat = _chat(engine)
    _, prompt = _ask_and_check(engine, chat, PROMPT.split("\n\n")[0])  # a short document, past the threshold
    old_end = len(prompt) - 1
    assert len(prompt) >= THRESHOLD and chat.session.target.copy_end == old_end
    _ask_and_check(engine, chat, "now the tests")
    on_copy = _prefill_calls(monkeypatch)
    result, prompt = _ask_and_check(engine, chat, PROMPT * 2)  # most of the prompt: the copy prefills it all
    assert chat.session.target.copy_end == chat.session.target.sequences_from == len(prompt) - 1
    assert result.stats.prompt_tokens_reused == old_end  # the copy's bits up to the old end, kept
    assert sum(on_copy) >= len(prompt) - 1 - old_end


def test_a_fresh_sessions_turns_are_found_in_a_prompt_given_as_token_ids(bundle_dir, small_threshold):
    """The layout is the prompt's, whoever feeds it: a session that never saw the conversation finds its turns."""
    engine = Engine(bundle_dir(*SAME_VOCAB))
    chat = _chat(engine)
    chat.ask(PROMPT, CONFIG, algorithm="none")
    first_end = chat.session.target.sequences_from
    chat.ask("now the tests", CONFIG, algorithm="none")
    fresh = engine.session()
    fresh.generate(chat.ids, CONFIG, algorithm="none")
    assert fresh.target.sequences_from == first_end == chat.session.target.sequences_from
    assert isinstance(fresh.target, PagedSession)


def test_a_chat_restored_from_the_prefix_store_reuses_its_whole_cache(bundle_dir, small_threshold):
    """A chat about a long document leaves its slot to another conversation, then comes back: the store gives back
    its cache whole (the copy's part, and the answer fed as one-token sequences), and the next turn prefills only its
    own tokens and writes what a fresh session writes."""
    engine = Engine(bundle_dir(*SAME_VOCAB), long_prompt_precision=PRECISION)
    chat = _chat(engine)
    _ask_and_check(engine, chat, PROMPT)
    slot = chat.session
    cached, layout = list(slot.target.tokens), slot.target.cache_layout
    assert layout[0] > 0 and len(cached) == len(chat.ids) - 1
    store = PrefixStore(max_bytes=1 << 30, min_tokens=4)
    other = engine.tokenizer.encode("x = 1")
    assert store.prepare(slot, other).stored
    slot.generate(other, CONFIG, algorithm="none")
    chat.add("user", "now the tests")
    assert store.prepare(slot, chat.prompt_ids()).restored
    assert slot.target.tokens == cached and slot.target.cache_layout == layout
    result = chat.answer(CONFIG, algorithm="standard")
    prompt = chat.ids[:len(chat.ids) - len(chat._tokens_of(result))]
    fresh = engine.session().generate(prompt, CONFIG, algorithm="standard")
    assert result.token_ids == fresh.token_ids and bits(result.logprobs) == bits(fresh.logprobs)
    assert result.stats.prompt_tokens_reused == len(cached)
