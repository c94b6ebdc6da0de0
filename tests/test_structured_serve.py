"""Structured output through the server, as OpenAI's client sends it: response_format (json_object, json_schema),
the llama-server and vLLM constraint fields, tools with tool_choice auto / required / named, streamed tool calls,
a tool's answer sent back, and the 400s for what cannot be honoured. On loopback; every server stops by itself."""
from __future__ import annotations

import json
import re

import jsonschema
import pytest

openai = pytest.importorskip("openai", reason="the server tests need the test extra: pip install -e '.[test,serve]'")
pytest.importorskip("uvicorn", reason="the server tests need the serve extra: pip install -e '.[test,serve]'")

from edge_specdec.runtime import Engine, GenerationConfig  # noqa: E402
from edge_specdec.runtime.constraint import Constraint  # noqa: E402
from edge_specdec.serve import ServerSettings  # noqa: E402
from serve_helpers import TIME, WEATHER, serve_in_thread  # noqa: E402
from support import SAME_VOCAB  # noqa: E402

pytestmark = pytest.mark.slow

# A Hermes-style template written for these tests (Qwen2.5's shape): the tools in the system turn, each call as
# <tool_call> JSON </tool_call>, a tool's answer in a user turn of its own
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nYou may call these functions:\n{% for t in tools %}{{ t | tojson }}\n"
    "{% endfor %}Write each call as <tool_call>\n{\"name\": ..., \"arguments\": ...}\n</tool_call><|im_end|>\n"
    "{% endif %}{% for m in messages %}{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}"
    "\n</tool_response><|im_end|>\n{% elif m.tool_calls %}<|im_start|>assistant\n{% for c in m.tool_calls %}"
    "<tool_call>\n{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}"
    "\n</tool_call>{% endfor %}<|im_end|>\n{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 10},
                         "age": {"type": "integer", "minimum": 0, "maximum": 99}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def tools_bundle(bundle_dir, tmp_path_factory):
    import shutil
    copy = tmp_path_factory.mktemp("tools") / "pair"
    shutil.copytree(bundle_dir(*SAME_VOCAB), copy)
    (copy / "target" / "chat_template.jinja").write_text(TOOLS_TEMPLATE)
    return copy


@pytest.fixture(scope="module")
def engine(tools_bundle):
    return Engine(tools_bundle)


@pytest.fixture(scope="module")
def running(engine):
    with serve_in_thread(ServerSettings(str(engine.bundle.path), slots=1, warm_up=False, max_tokens=96),
                         engine) as running:
        yield running


@pytest.fixture(scope="module")
def client(running):
    return openai.OpenAI(base_url=running.url + "/v1", api_key="none", max_retries=0, timeout=120)


def test_json_schema_response_format_validates_and_equals_the_engines_own(client, engine):
    answer = client.chat.completions.create(
        model="x", messages=ASK, max_tokens=60, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    content = answer.choices[0].message.content
    assert answer.choices[0].finish_reason == "stop", content
    jsonschema.validate(json.loads(content), PERSON)
    direct = engine.session().generate(engine.chat_prompt(ASK), GenerationConfig(
        max_new_tokens=60, constraint=Constraint.json_schema(PERSON), repetition_penalty=engine.default_config
        .repetition_penalty))
    assert content == direct.text


def test_json_object_and_the_extension_fields(client):
    answer = client.chat.completions.create(model="x", messages=ASK, max_tokens=40, temperature=0,
                                            response_format={"type": "json_object"})
    assert isinstance(json.loads(answer.choices[0].message.content), dict)
    regex = client.completions.create(model="x", prompt="x = ", max_tokens=12, temperature=0,
                                      extra_body={"guided_regex": r"[0-9]{1,4}\.[0-9]"})
    assert re.fullmatch(r"[0-9]{1,4}\.[0-9]", regex.choices[0].text)
    grammar = client.completions.create(model="x", prompt="x = ", max_tokens=12, temperature=0,
                                        extra_body={"grammar": 'root ::= "yes" | "no"'})
    assert grammar.choices[0].text in ("yes", "no")
    schema = client.completions.create(model="x", prompt="x = ", max_tokens=40, temperature=0,
                                       extra_body={"json_schema": PERSON})
    jsonschema.validate(json.loads(schema.choices[0].text), PERSON)
    assert schema.model_extra["edge_specdec"]["grammar_tokens_accepted"] >= 1  # '{"name": "' is forced


@pytest.mark.parametrize("body,message", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object",
                                                                                        "if": {}}}}}, "if"),
    ({"response_format": {"type": "xml"}}, "response_format must be"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": PERSON}}}, "name and a schema"),
    ({"guided_regex": "[a-"}, "guided_regex: the regex constraint cannot be used"),
    ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "one constraint per request"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "nope"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "function.name"),
    ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "cannot be combined"),
    ({"tool_choice": "required"}, "tool_choice needs tools"),
    ({"guided_regex": r"[^\s\S]"}, "guided_regex: the regex constraint admits no text"),
    ({"grammar": "root ::= root"}, "grammar: the grammar constraint admits no text"),
    ({"guided_regex": "a{100000}"}, "grammar engine's limit"),
])
def test_what_cannot_be_honoured_is_a_400_naming_it(client, body, message):
    with pytest.raises(openai.BadRequestError, match=message):
        client.chat.completions.create(model="x", messages=ASK, max_tokens=8, extra_body=body)


def test_a_streamed_request_whose_constraint_admits_no_text_is_a_400_before_any_chunk(client):
    with pytest.raises(openai.BadRequestError, match="admits no text"):
        client.completions.create(model="x", prompt="x = ", max_tokens=8, stream=True,
                                  extra_body={"grammar": 'start: "ab" x\nx: x'})


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_required_and_named_tools_answer_with_calls_that_fit_the_schema(client, choice):
    answer = client.chat.completions.create(model="x", messages=ASK, max_tokens=80, temperature=0,
                                            tools=[WEATHER, TIME], tool_choice=choice)
    choice_out = answer.choices[0]
    assert choice_out.finish_reason == "tool_calls" and choice_out.message.tool_calls
    for call in choice_out.message.tool_calls:
        tool = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]
        jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
        assert call.id.startswith("call_") and call.type == "function"
    if isinstance(choice, dict):
        assert {c.function.name for c in choice_out.message.tool_calls} == {"get_weather"}


def test_streamed_tool_calls_assemble_to_the_same_calls(client):
    kwargs = dict(model="x", messages=ASK, max_tokens=80, temperature=0, tools=[WEATHER], tool_choice="required")
    whole = client.chat.completions.create(**kwargs).choices[0].message.tool_calls
    calls, reasons, content = {}, [], ""
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for part in delta.tool_calls or []:
            entry = calls.setdefault(part.index, {"name": "", "arguments": ""})
            entry["name"] += part.function.name or ""
            entry["arguments"] += part.function.arguments or ""
        reasons.append(chunk.choices[0].finish_reason)
    assert reasons[-1] == "tool_calls" and "<tool_call>" not in content
    assert [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())] == \
        [(c.function.name, json.loads(c.function.arguments)) for c in whole]


def test_streamed_tool_calls_carry_the_logprobs_the_whole_answer_does(client):
    kwargs = dict(model="x", messages=ASK, max_tokens=80, temperature=0, tools=[WEATHER], tool_choice="required",
                  logprobs=True, top_logprobs=2)
    whole = client.chat.completions.create(**kwargs).choices[0]
    assert whole.finish_reason == "tool_calls" and len(whole.logprobs.content) > 10
    streamed = []
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed += chunk.choices[0].logprobs.content or []
    assert [(e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs]) for e in streamed] == \
        [(e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs]) for e in whole.logprobs.content]


@pytest.mark.parametrize("pieces", [["Sure.", " \n", "\n<tool", "_call>\n{\"name\": \"f\"}\n</tool_call>"],
                                    ["Sure. \n\n<tool_call>\n{\"name\": \"f\"}\n</tool_call>"]])
def test_streamed_content_before_a_call_is_the_whole_answers(pieces):
    """The whole answer's content is stripped of the whitespace before its call: the stream's too."""
    from edge_specdec.runtime.tool_calls import FORMATS
    from edge_specdec.serve.app import HeldText

    held = HeldText(FORMATS[0].open)
    sent = "".join(held.pass_on(piece) for piece in pieces)
    content, calls = FORMATS[0].parse("".join(pieces))
    assert calls and sent == content == "Sure."


def test_whitespace_held_before_a_possible_call_goes_on_when_text_follows():
    from edge_specdec.serve.app import HeldText

    held = HeldText("<tool_call>\n")
    assert [held.pass_on(piece) for piece in ("a", "  ", "b\n", "<tool")] == ["a", "", "  b", ""]
    assert held.rest() == "\n<tool"  # no call came: the answer ends as it was written


def test_auto_answers_with_text_or_calls_and_never_a_broken_call(client):
    answer = client.chat.completions.create(model="x", messages=ASK, max_tokens=60, temperature=0,
                                            tools=[WEATHER], tool_choice="auto")
    message = answer.choices[0].message
    if message.tool_calls:
        assert answer.choices[0].finish_reason == "tool_calls"
        jsonschema.validate(json.loads(message.tool_calls[0].function.arguments), WEATHER["function"]["parameters"])
    else:
        assert "<tool_call>" not in (message.content or "")


def test_a_tool_answer_round_trips_through_the_template(client, engine):
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                             "arguments": json.dumps({"city": "Paris"})}}
    messages = ASK + [{"role": "assistant", "content": None, "tool_calls": [call]},
                      {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"}]
    answer = client.chat.completions.create(model="x", messages=messages, max_tokens=8, temperature=0,
                                            tools=[WEATHER])
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")
    prompt = engine.chat_template.render(
        [ASK[0], {"role": "assistant", "content": "", "tool_calls": [{**call, "function": {
            "name": "get_weather", "arguments": {"city": "Paris"}}}]},
         {"role": "tool", "content": "18 degrees, sunny"}], [WEATHER])
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt
    assert "<tool_response>\n18 degrees, sunny" in prompt
    assert answer.usage.prompt_tokens == len(engine.chat_prompt(
        [ASK[0], {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": {"city": "Paris"}}}]},
         {"role": "tool", "content": "18 degrees, sunny", "tool_call_id": "call_1"}], [WEATHER]))


def test_only_a_template_that_teaches_calls_gets_a_tool_format():
    from edge_specdec.runtime.tool_calls import tool_format
    from serve_helpers import CHATML
    assert tool_format(None) is None and tool_format(CHATML) is None
    assert tool_format(TOOLS_TEMPLATE).open == "<tool_call>\n"
