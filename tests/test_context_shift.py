"""A conversation longer than the context: refused by default with the count of tokens over; with the shift, the
oldest exchanges after the system prompt dropped (tool calls with their results), and the turn what a fresh session
writes on the kept messages."""
from __future__ import annotations

import io
import threading

import numpy as np
import pytest

import edge_specdec.runtime.session as session_module
from edge_specdec.errors import EdgeSpecdecError
from edge_specdec.runtime import Engine, GenerationConfig
from edge_specdec.runtime.chat import ChatTemplate
from edge_specdec.runtime.context_shift import exchanges, shift
from edge_specdec.runtime.session import ContextOverflowError
from support import SAME_VOCAB

CHAT = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>\n{% endfor %}" \
       "{% if add_generation_prompt %}<assistant>{% endif %}"
CONTEXT = 512  # the tiny models'
CONFIG = GenerationConfig(max_new_tokens=24, ignore_eos=True, logprobs=True)
SYSTEM = "be brief"
# user turns long enough that a few of them and their answers fill the tiny context
TURNS = [f"question {i}: " + " ".join(f"def f{i}_{j}(a, b): return a + b" for j in range(8)) for i in range(8)]


@pytest.fixture
def engine(bundle_dir) -> Engine:
    engine = Engine(bundle_dir(*SAME_VOCAB))
    engine.__dict__["chat_template"] = ChatTemplate(CHAT)  # the tiny tokenizers have none of their own
    assert engine.target_model.max_context == CONTEXT
    return engine


def bits(result) -> list:
    return [np.float64(lp.logprob).view(np.int64) for lp in result.logprobs]


def history(n: int) -> list[dict]:
    """The system prompt and n exchanges of a long question and a short answer."""
    messages = [{"role": "system", "content": SYSTEM}]
    for turn in TURNS[:n]:
        messages += [{"role": "user", "content": turn}, {"role": "assistant", "content": "ok"}]
    return messages


def test_a_turn_past_the_context_is_refused_with_the_tokens_over_and_the_conversation_stays(engine):
    chat = engine.start_chat(system=SYSTEM)
    for message in history(len(TURNS))[1:]:
        chat.add(message["role"], message["content"])
    before = list(chat.messages)
    question = "and now?"
    prompt = engine.chat_prompt(before + [{"role": "user", "content": question}])
    assert len(prompt) + CONFIG.max_new_tokens > CONTEXT
    over = len(prompt) + CONFIG.max_new_tokens - CONTEXT
    with pytest.raises(ContextOverflowError, match=f"{over} tokens over.*on_overflow='shift'"):
        chat.ask(question, CONFIG, algorithm="standard")
    assert chat.messages == before  # the refused question did not join the conversation


def test_an_unknown_overflow_policy_is_refused(engine):
    with pytest.raises(EdgeSpecdecError, match="on_overflow must be one of 'error', 'shift'"):
        engine.start_chat(on_overflow="truncate")


def test_a_shifted_turn_writes_what_a_fresh_session_writes_on_the_kept_messages(engine):
    chat = engine.start_chat(system=SYSTEM, on_overflow="shift")
    everything = [{"role": "system", "content": SYSTEM}]
    for turn in TURNS:
        cached = list(chat.session.target.tokens)
        result = chat.ask(turn, CONFIG, algorithm="standard")
        everything += [{"role": "user", "content": turn}, {"role": "assistant", "content": result.text}]
        if "context_shift" in result.extra:
            break
    else:
        pytest.fail("the conversation never filled the context")
    record = result.extra["context_shift"]
    kept = chat.messages[:-1]  # the messages the turn answered
    # the oldest exchanges went, whole: the system prompt and the newest messages stay, in order
    assert kept[0] == everything[0] and kept[1:] == everything[len(everything) - len(kept):-1]
    assert kept[1]["role"] == "user" and record["dropped_messages"] == len(everything) - 1 - len(kept) > 0
    prompt = engine.chat_prompt(kept)
    assert len(prompt) <= 0.75 * CONTEXT  # down to three quarters of the context
    one_more = everything[:1] + everything[len(everything) - len(kept) - 2:-1]  # the last exchange dropped back
    assert len(engine.chat_prompt(one_more)) > 0.75 * CONTEXT  # and no further than that
    fresh = engine.session().generate(prompt, CONFIG, algorithm="standard")
    assert result.token_ids == fresh.token_ids and bits(result) == bits(fresh)
    # only the KV of the tokens the new prompt shares with the cache (the system prompt and the tags after it) was
    # kept, nothing from the kept messages' old positions; the rest was prefilled
    shared = next(i for i, (a, b) in enumerate(zip(cached + [-1], prompt)) if a != b)
    assert 0 < result.stats.prompt_tokens_reused <= shared < len(engine.chat_prompt(kept[:2])) - 8
    assert record["prefilled_tokens"] == len(prompt) - result.stats.prompt_tokens_reused


def test_tool_calls_go_with_their_results_and_never_a_result_without_its_call():
    messages = [{"role": "system", "content": "s" * 10},
                {"role": "user", "content": "u" * 10},
                {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "content": "r" * 40},
                {"role": "assistant", "content": "a" * 10},
                {"role": "user", "content": "u" * 10},
                {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "g", "arguments": "{}"}}]},
                {"role": "tool", "content": "r" * 10},
                {"role": "user", "content": "q" * 10}]
    assert exchanges(messages) == (1, [(1, 5), (5, 8), (8, 9)])

    def tokenize(kept):  # a token per character
        return [0] * sum(len(m["content"]) for m in kept)

    # 100 characters: dropping the first call alone (its result is the bulk) would fit, but the exchange goes whole
    kept, ids, dropped = shift(messages, tokenize, context=100, wanted=10)
    assert kept == messages[:1] + messages[5:] and dropped == 4 and len(ids) == 40
    assert not any(m["role"] == "tool" for m in kept[:kept.index(messages[6])])


def chars(kept: list[dict]) -> list[int]:
    """A token per character of the messages' contents."""
    return [0] * sum(len(m["content"]) for m in kept)


def test_later_instructions_stay_and_user_messages_in_a_row_are_one_turn():
    """A system or developer message after the first exchange instructs the turns after it: the shift keeps it.
    A document and the question about it, two user messages in a row, are one turn: they go, or stay, together."""
    later = {"role": "system", "content": "answer in French"}
    messages = [{"role": "developer", "content": "d" * 5},
                {"role": "user", "content": "u" * 40}, {"role": "assistant", "content": "a" * 5},
                later,
                {"role": "user", "content": "DOC" + "d" * 20}, {"role": "user", "content": "summarize it"},
                {"role": "assistant", "content": "b" * 5},
                {"role": "user", "content": "q" * 10}]
    assert exchanges(messages) == (1, [(1, 4), (4, 7), (7, 8)])
    kept, ids, dropped = shift(messages, chars, context=100, wanted=25)  # the first exchange goes, not `later`
    assert kept == messages[:1] + messages[3:] and dropped == 2 and len(ids) == 71
    kept, ids, dropped = shift(messages, chars, context=100, wanted=40)  # the document's turn goes whole
    assert kept == [messages[0], later, messages[-1]] and dropped == 5 and len(ids) == 31


def test_the_refusal_names_the_tool_results_of_the_last_turn():
    messages = [{"role": "system", "content": "s" * 5}, {"role": "user", "content": "u" * 10},
                {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "content": "r" * 90}]
    with pytest.raises(ContextOverflowError, match="15 tokens over. The system messages and the last user turn with "
                                                   "its tool calls and results alone do not fit.*a tool result"):
        shift(messages, chars, context=100, wanted=10)


def test_a_shift_asked_for_more_than_fits_keeps_what_leaves_the_room_needed():
    """A request that asked for no number of tokens (the server's case) needs room for one: the shift drops what
    it can and the answer gets the room left, where without the shift it would get the room left too."""
    messages = [{"role": "system", "content": "s" * 5}, {"role": "user", "content": "u" * 30},
                {"role": "assistant", "content": "a" * 5}, {"role": "user", "content": "q" * 80}]
    with pytest.raises(ContextOverflowError, match="10 tokens over"):
        shift(messages, chars, context=100, wanted=25)
    kept, ids, dropped = shift(messages, chars, context=100, wanted=25, needed=1)
    assert kept == [messages[0], messages[-1]] and len(ids) == 85 and dropped == 2


def test_a_shifted_turn_that_fails_leaves_the_conversation_as_it_was(engine):
    chat = engine.start_chat(system=SYSTEM, on_overflow="shift")
    for message in history(len(TURNS))[1:]:
        chat.add(message["role"], message["content"])
    before = list(chat.messages)

    def gone(piece):
        raise RuntimeError("the client went away")
    with pytest.raises(RuntimeError, match="the client went away"):
        chat.ask("and now?", CONFIG, on_text=gone, algorithm="standard")
    assert chat.messages == before  # the dropped messages too, not only the question
    result = chat.ask("and now?", CONFIG, algorithm="standard")  # and the turn, asked again, shifts as it would
    assert result.extra["context_shift"]["dropped_messages"] > 0


def test_a_shifted_turn_stopped_during_its_prefill_leaves_the_conversation_as_it_was(engine, monkeypatch):
    """A user's stop (or a client that leaves) while a shifted turn's prompt is prefilled: no answer, so neither the
    question nor an empty answer joins the conversation and no message goes; asked again, the turn reuses what the
    stopped prefill fed and writes what a fresh session writes on the kept messages."""
    monkeypatch.setattr(session_module, "SEQUENCES_AFTER", 48)  # the shifted prompt goes in several calls
    chat = engine.start_chat(system=SYSTEM, on_overflow="shift")
    for message in history(len(TURNS))[1:]:
        chat.add(message["role"], message["content"])
    before = list(chat.messages)
    cancel, at = threading.Event(), []

    def stop_after_the_first_call(progress):
        if progress.done > progress.cached:
            at.append(progress.done)
            cancel.set()
    stopped = chat.ask("and now?", CONFIG, cancel=cancel, on_prefill=stop_after_the_first_call, algorithm="standard")
    assert stopped.stop_reason == "stopped" and stopped.token_ids == [] and len(at) == 1
    assert chat.messages == before and "context_shift" not in stopped.extra
    result = chat.ask("and now?", CONFIG, algorithm="standard")
    assert result.extra["context_shift"]["dropped_messages"] > 0
    assert result.stats.prompt_tokens_reused >= at[0]  # the stopped turn's calls, kept
    fresh = engine.session().generate(engine.chat_prompt(chat.messages[:-1]), CONFIG, algorithm="standard")
    assert result.token_ids == fresh.token_ids and bits(result) == bits(fresh)


def test_chat_leaves_out_a_question_stopped_before_its_answer_began(engine, capsys, monkeypatch):
    """Ctrl-C while a turn's prompt is prefilled (between two of its calls): chat says the question was left out,
    and the conversation goes on without it."""
    from edge_specdec.cli.chat import chat_loop
    from edge_specdec.runtime import SpeculativeConfig
    from edge_specdec.runtime.generate import PrefillWatch

    # the second turn's prompt goes in two calls: the first turn's (kept in the cache) up to its answer, then the
    # rest as one-token sequences (session.py, "A chat's turns")
    monkeypatch.setattr(session_module, "SEQUENCES_AFTER", 48)
    real_watch, stops = PrefillWatch.__call__, []

    def ctrl_c_between_two_calls(self, length):
        real_watch(self, length)
        if 0 < length < self.total and not stops:
            stops.append(length)
            raise KeyboardInterrupt
    monkeypatch.setattr(PrefillWatch, "__call__", ctrl_c_between_two_calls)
    chats = []
    real_start = type(engine).start_chat
    monkeypatch.setattr(type(engine), "start_chat", lambda self, *a: chats.append(real_start(self, *a)) or chats[0])
    questions = [TURNS[0], "the second question", "the third question"]
    status = chat_loop(engine, CONFIG.with_defaults(engine.default_config), SpeculativeConfig(algorithm="standard"),
                       system=SYSTEM, lines=io.StringIO("\n".join(questions) + "\n"), interactive=True,
                       out=io.StringIO())
    err = capsys.readouterr().err
    assert status == 0 and len(stops) == 1 and err.count("the question was left out of the conversation") == 1
    asked = [m["content"] for m in chats[0].messages if m["role"] == "user"]
    assert asked == [questions[0], questions[2]] and chats[0].messages[-1]["role"] == "assistant"


def test_the_system_prompt_and_the_last_message_that_alone_do_not_fit_are_refused(engine):
    chat = engine.start_chat(system=" ".join(TURNS[:3]), on_overflow="shift")
    chat.add("user", TURNS[3])
    chat.add("assistant", "ok")
    question = " ".join(TURNS[4:7])
    alone = engine.chat_prompt([chat.messages[0], {"role": "user", "content": question}])
    over = len(alone) + CONFIG.max_new_tokens - CONTEXT
    assert over > 0
    with pytest.raises(ContextOverflowError,
                       match=f"{over} tokens over. The system messages and the last user turn alone"):
        chat.ask(question, CONFIG, algorithm="standard")
    assert [m["content"] for m in chat.messages[1:]] == [TURNS[3], "ok"]


@pytest.mark.parametrize("on_overflow", ["error", "shift"])
def test_chat_says_what_happened_at_the_context_and_goes_on_on_a_terminal(engine, capsys, on_overflow):
    from edge_specdec.cli.chat import chat_loop
    from edge_specdec.runtime import SpeculativeConfig

    lines = io.StringIO("\n".join(TURNS) + "\nthe last one\n")
    status = chat_loop(engine, CONFIG.with_defaults(engine.default_config), SpeculativeConfig(algorithm="standard"),
                       system=SYSTEM, lines=lines, interactive=True, on_overflow=on_overflow)
    out, err = capsys.readouterr()
    assert status == 0
    answers = out.count("\n")
    if on_overflow == "error":
        assert "tokens over" in err and "--context-shift" in err and 0 < answers < len(TURNS) + 1
    else:
        assert "oldest messages went to fit the context" in err and "prefilled again" in err
        assert answers == len(TURNS) + 1


def test_chat_from_a_pipe_stops_at_a_turn_past_the_context(engine):
    from edge_specdec.cli.chat import chat_loop
    from edge_specdec.runtime import SpeculativeConfig

    with pytest.raises(ContextOverflowError, match="tokens over"):
        chat_loop(engine, CONFIG.with_defaults(engine.default_config), SpeculativeConfig(algorithm="standard"),
                  system=SYSTEM, lines=io.StringIO("\n".join(TURNS) + "\n"), interactive=False, out=io.StringIO())


@pytest.mark.parametrize("command", ["chat", "serve"])
def test_the_context_shift_is_off_unless_asked_for(command):
    from edge_specdec.cli import build_parser

    parser = build_parser()
    assert parser.parse_args([command]).context_shift is False
    assert parser.parse_args([command, "--context-shift"]).context_shift is True
