"""A chat past the context on the server: a 400 that counts the tokens over; with --context-shift, the oldest
exchanges dropped, the answer what the kept messages get, and the counts in usage and the edge_specdec object."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

pytest.importorskip("uvicorn", reason="the server tests need the serve extra: pip install -e '.[test,serve]'")

from edge_specdec.runtime import Engine  # noqa: E402
from edge_specdec.serve import ServerSettings  # noqa: E402
from serve_helpers import chat_bundle_copy, serve_in_thread  # noqa: E402
from support import SAME_VOCAB  # noqa: E402

pytestmark = pytest.mark.slow  # starts a server

CONTEXT = 512  # the tiny models'
MAX_TOKENS = 24
SYSTEM = {"role": "system", "content": "be brief"}


def long_history(n: int) -> list[dict]:
    """The system prompt, n exchanges of a long question and a short answer, and a new question."""
    messages = [SYSTEM]
    for i in range(n):
        messages += [{"role": "user", "content": f"question {i}: " + " ".join(f"def f{i}_{j}(a): return a"
                                                                               for j in range(8))},
                     {"role": "assistant", "content": "ok"}]
    return messages + [{"role": "user", "content": "and now?"}]


@pytest.fixture(scope="module")
def engine(bundle_dir, tmp_path_factory):
    return Engine(chat_bundle_copy(bundle_dir(*SAME_VOCAB), tmp_path_factory.mktemp("shift")))


def chat(running, messages: list[dict], **fields) -> tuple[int, dict]:
    body = {"messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0, "logprobs": True, "ignore_eos": True,
            "edge_specdec": {"algorithm": "standard"}, **fields}
    request = urllib.request.Request(running.api + "/chat/completions", data=json.dumps(body).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def streamed(running, messages: list[dict]) -> list[dict]:
    """The chunks of a streamed chat with include_usage."""
    body = {"messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}, "edge_specdec": {"algorithm": "standard"}}
    request = urllib.request.Request(running.api + "/chat/completions", data=json.dumps(body).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        lines = response.read().decode().splitlines()
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


def serve(engine, context_shift: bool):
    return serve_in_thread(ServerSettings(bundle=str(engine.bundle.path), slots=1, warm_up=False,
                                          context_shift=context_shift), engine)


def test_a_chat_past_the_context_gets_a_400_with_the_tokens_over(engine):
    messages = long_history(8)
    over = len(engine.chat_prompt(messages)) + MAX_TOKENS - CONTEXT
    assert over > 0
    with serve(engine, context_shift=False) as running:
        status, answer = chat(running, messages)
    assert status == 400 and answer["error"]["code"] == "context_length_exceeded", answer
    assert f"{over} tokens over" in answer["error"]["message"] and "--context-shift" in answer["error"]["message"]


def test_a_shifted_chat_answers_as_the_kept_messages_do_and_says_what_went(engine):
    messages = long_history(8)
    with serve(engine, context_shift=True) as running:
        status, shifted = chat(running, messages)
        assert status == 200, shifted
        record = shifted["edge_specdec"]["context_shift"]
        dropped = record["dropped_messages"]
        kept = messages[:1] + messages[1 + dropped:]
        assert dropped > 0 and dropped % 2 == 0 and kept[1]["role"] == "user"  # whole exchanges
        prompt_tokens = len(engine.chat_prompt(kept))
        assert prompt_tokens <= 0.75 * CONTEXT < len(engine.chat_prompt(messages[:1] + messages[dropped - 1:]))
        usage = shifted["usage"]
        assert usage["prompt_tokens"] == prompt_tokens and usage["context_shift"] == record
        assert record["prefilled_tokens"] == prompt_tokens - usage["prompt_tokens_details"]["cached_tokens"]
        status, fresh = chat(running, kept)  # fits: no shift
        chunks = streamed(running, messages)
        assert chunks[-2]["edge_specdec"]["context_shift"]["dropped_messages"] == dropped  # the finishing chunk
        assert chunks[-1]["usage"]["context_shift"]["dropped_messages"] == dropped
        assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1]) == \
            shifted["choices"][0]["message"]["content"]
        assert status == 200 and "context_shift" not in fresh["edge_specdec"]
    assert shifted["choices"][0]["message"]["content"] == fresh["choices"][0]["message"]["content"]
    assert shifted["choices"][0]["logprobs"] == fresh["choices"][0]["logprobs"]  # the same floats, bit for bit


def test_a_system_prompt_and_last_message_past_the_context_get_a_400_even_with_the_shift(engine):
    question = " ".join(m["content"] for m in long_history(8)[1::2])
    messages = [SYSTEM, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"},
                {"role": "user", "content": question}]
    over = len(engine.chat_prompt([SYSTEM, messages[-1]])) + MAX_TOKENS - CONTEXT
    assert over > 0
    with serve(engine, context_shift=True) as running:
        status, answer = chat(running, messages)
    assert status == 400 and answer["error"]["code"] == "context_length_exceeded", answer
    assert f"{over} tokens over. The system messages and the last user turn alone" in answer["error"]["message"]


def test_a_chat_without_max_tokens_is_answered_with_the_shift_where_it_is_without(engine):
    """Without max_tokens the shift aims at a quarter of the context, but a request whose system prompt and last
    question leave less than that still gets the room left, as on a server without the shift, not a 400."""
    words = 10
    while len(engine.chat_prompt([SYSTEM, question := {"role": "user", "content": " ".join(
            f"w{i}" for i in range(words))}])) <= CONTEXT - CONTEXT // 8:
        words += 5
    alone = len(engine.chat_prompt([SYSTEM, question]))
    assert alone + 1 <= CONTEXT < alone + CONTEXT // 4
    messages = [SYSTEM, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}, question]
    answers = {}
    for context_shift in (False, True):
        with serve(engine, context_shift=context_shift) as running:
            answers[context_shift] = chat(running, messages, max_tokens=None, ignore_eos=False)
    for status, answer in answers.values():
        assert status == 200, answer
    assert answers[True][1]["edge_specdec"]["context_shift"]["dropped_messages"] == 2
    assert answers[True][1]["usage"]["prompt_tokens"] == alone


def test_a_chat_over_the_servers_max_tokens_is_told_so_with_the_shift_on(engine):
    """--max-tokens is the server's limit whether or not it shifts: a request over it gets that 400, not one that
    blames the messages."""
    settings = ServerSettings(bundle=str(engine.bundle.path), slots=1, warm_up=False, context_shift=True,
                              max_tokens=100)
    with serve_in_thread(settings, engine) as running:
        status, answer = chat(running, long_history(6), max_tokens=480)
    assert status == 400 and answer["error"]["param"] == "max_tokens", answer
    assert "over this server's limit of 100 (--max-tokens)" in answer["error"]["message"]
