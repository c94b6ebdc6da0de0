"""OpenAI's wire format: request bodies in (checked field by field), responses, stream chunks and errors out.

Both endpoints take the fields OpenAI documents for them (chat: response_format and tools too; presence_penalty,
frequency_penalty and logit_bias in OpenAI's ranges), the extras llama-server and vLLM accept (top_k, min_p,
repetition_penalty, ignore_eos; a constraint as `json_schema`, `grammar`,
`guided_json`, `guided_regex` or `guided_grammar`) and one extension object, `edge_specdec`, with the speculative
settings of the request (a SpeculativeConfig: algorithm, num_assistant_tokens, confidence, lookup, draft_policy,
draft_window).
Responses carry the run's statistics in an `edge_specdec` object beside OpenAI's fields; a stream marks each content
chunk with the source of its text (drafted and accepted, forced by a grammar, or written by the target) the same
way. Anything we cannot honour (n > 1, a schema feature the grammar engine lacks, an unknown field) is a 400 that
names it.
"""
from __future__ import annotations

import json
import math
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..errors import EdgeSpecdecError
from ..runtime.generate import PrefillProgress, Result
from ..runtime.constraint import Constraint
from ..runtime.grammar import constraint_problem
from ..runtime.tool_calls import check_tools
from ..runtime.sampling import (MAX_FREQUENCY_PENALTY, MAX_LOGIT_BIAS, MAX_PRESENCE_PENALTY, MAX_TOP_LOGPROBS,
                                GenerationConfig, TokenLogprob)
from ..runtime.settings import SpeculativeConfig

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; chat defaults to the room left
MAX_STOP_STRINGS = 4  # as OpenAI
FINISH_REASONS = {"eos": "stop", "stop_string": "stop", "length": "length", "stopped": "stop",
                  "interrupted": "stop", "grammar": "stop"}
CHAT_ROLES = {"system", "user", "assistant", "developer", "tool"}
# the constraint fields llama-server (json_schema, grammar) and vLLM (guided_*) take beside OpenAI's response_format
CONSTRAINT_FIELDS = {"json_schema": "json_schema", "grammar": "grammar", "guided_json": "json_schema",
                     "guided_regex": "regex", "guided_grammar": "grammar"}
MAX_JSON_DEPTH = 64  # a request body nests 4 levels (messages[i].content[j].text); JSON schemas a few more
MAX_ASSISTANT_TOKENS = 64  # the most tokens a request may have drafted per round (it sizes the target's blocks)


class RequestError(EdgeSpecdecError):
    """A request the server answers with an OpenAI error object instead of a completion."""

    def __init__(self, message: str, status: int = 400, param: Optional[str] = None, code: Optional[str] = None,
                 kind: str = "invalid_request_error", headers: Optional[dict[str, str]] = None):
        super().__init__(message)
        self.status, self.param, self.code, self.kind, self.headers = status, param, code, kind, headers or {}

    def body(self) -> dict:
        return error_body(str(self), self.kind, self.param, self.code)


def error_body(message: str, kind: str = "invalid_request_error", param: Optional[str] = None,
               code: Optional[str] = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@dataclass
class ParsedRequest:
    """A checked request: what to generate from, how, and how to answer."""
    kind: str  # "chat" or "completion"
    messages: Optional[list[dict[str, str]]]  # chat
    prompt: Optional[str | list[int]]  # completion: text or token ids
    config: GenerationConfig
    max_tokens: Optional[int]  # None: the room left in the context (chat only), up to the server's cap
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)  # how it drafts (`edge_specdec`)
    stream: bool = False
    include_usage: bool = False
    model: Optional[str] = None
    return_progress: bool = False  # stream a long prompt's prefill progress (llama-server's prompt_progress)
    tools: Optional[list[dict]] = None  # chat: the functions the model may call (None: no tools, or tool_choice none)
    tool_choice: Any = "auto"           # "auto", "required" or {"type": "function", "function": {"name": ...}}
    parallel_tool_calls: bool = True


# The fields each endpoint takes. Fields OpenAI clients send that change nothing here are accepted only with a
# value that changes nothing (see NEUTRAL).
COMMON = {"model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "stop", "seed", "n", "user",
          "top_k", "min_p", "repetition_penalty", "ignore_eos", "return_progress", "edge_specdec", "frequency_penalty",
          "presence_penalty", "logit_bias", "metadata", "store", "service_tier"} | set(CONSTRAINT_FIELDS)
FIELDS = {"chat": COMMON | {"messages", "max_completion_tokens", "logprobs", "top_logprobs", "response_format",
                            "tools", "tool_choice", "parallel_tool_calls"},
          "completion": COMMON | {"prompt", "logprobs", "echo", "best_of", "suffix"}}
# field -> the values that ask for nothing we do not do
NEUTRAL: dict[str, Callable[[Any], bool]] = {
    "n": lambda v: v == 1, "best_of": lambda v: v == 1, "echo": lambda v: v is False, "suffix": lambda v: not v,
    "user": lambda v: True, "metadata": lambda v: True, "store": lambda v: True, "service_tier": lambda v: True,
}
EXTENSION_FIELDS = {"algorithm", "num_assistant_tokens", "confidence", "lookup", "draft_policy", "draft_window"}


def parse_request(body: Any, kind: str, default_repetition_penalty: float = 1.0) -> ParsedRequest:
    """Check a request body for `kind` ("chat" or "completion") field by field; RequestError names the first
    field that is wrong."""
    _check_field_names(body, kind)
    get = _Fields(body)
    stream = get.boolean("stream", False)
    stream_options = get.object("stream_options")
    if stream_options and not stream:
        raise RequestError("stream_options is only allowed when stream is true.", param="stream_options")
    extra = set(stream_options or {}) - {"include_usage", "continuous_usage_stats"}
    if extra:
        raise RequestError(f"unrecognized stream_options field: {sorted(extra)[0]}.", param="stream_options")
    max_tokens = get.integer("max_completion_tokens" if body.get("max_completion_tokens") is not None
                             else "max_tokens", None, low=1)
    if kind == "completion" and max_tokens is None:
        max_tokens = COMPLETIONS_DEFAULT_MAX_TOKENS
    wants_logprobs, top = _logprobs(get, kind)
    top_k = get.integer("top_k", 0, low=-1)
    config = GenerationConfig(
        max_new_tokens=max_tokens or 1,  # a chat without max_tokens gets the room left (see the server)
        temperature=get.number("temperature", 1.0, low=0.0, high=2.0),
        top_p=get.number("top_p", 1.0, low=0.0, high=1.0, low_open=True),
        top_k=max(top_k, 0),  # -1 means off in vLLM and llama-server
        seed=get.integer("seed", None, low=0),
        stop_strings=_stop_strings(body.get("stop")),
        ignore_eos=get.boolean("ignore_eos", False),
        repetition_penalty=get.number("repetition_penalty", default_repetition_penalty, low=0.0, high=10.0,
                                      low_open=True),
        min_p=get.number("min_p", 0.0, low=0.0, high=1.0),
        presence_penalty=get.number("presence_penalty", 0.0, low=-MAX_PRESENCE_PENALTY, high=MAX_PRESENCE_PENALTY),
        frequency_penalty=get.number("frequency_penalty", 0.0, low=-MAX_FREQUENCY_PENALTY,
                                     high=MAX_FREQUENCY_PENALTY),
        logit_bias=_logit_bias(body.get("logit_bias")),
        logprobs=wants_logprobs, top_logprobs=top, constraint=_constraint(body))
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError("model must be a string.", param="model")
    parsed = ParsedRequest(kind, _messages(body.get("messages")) if kind == "chat" else None,
                           _prompt(body.get("prompt")) if kind == "completion" else None, config, max_tokens,
                           _extension(body.get("edge_specdec")), stream,
                           bool((stream_options or {}).get("include_usage")), model,
                           return_progress=get.boolean("return_progress", False) and stream)
    if body.get("tools") and body.get("tool_choice") != "none":
        if config.constraint is not None:
            raise RequestError("tools and a response format or grammar cannot be combined in one request.",
                               param="tools")
        try:
            parsed.tools, parsed.tool_choice = check_tools(body["tools"], body.get("tool_choice"))
        except EdgeSpecdecError as exc:
            raise RequestError(str(exc), param="tools") from None
        parsed.parallel_tool_calls = get.boolean("parallel_tool_calls", True)
    elif body.get("tool_choice") not in (None, "none", "auto"):
        raise RequestError("tool_choice needs tools.", param="tool_choice")
    return parsed


def _check_field_names(body: Any, kind: str) -> None:
    """A JSON object whose fields this endpoint knows, with OpenAI's fields that change nothing here (n, best_of,
    ...) at their neutral values."""
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object.")
    unknown = sorted(set(body) - FIELDS[kind])
    if unknown:
        raise RequestError(f"unrecognized request argument supplied: {unknown[0]}.", param=unknown[0])
    for name, neutral in NEUTRAL.items():
        if name in body and body[name] is not None and not neutral(body[name]):
            raise RequestError(f"{name}={body[name]!r} is not supported by this server"
                               + (" (one choice per request)" if name in ("n", "best_of") else "") + ".", param=name)


def _logprobs(get: "_Fields", kind: str) -> tuple[bool, int]:
    """Whether logprobs are asked for, and how many alternatives: chat has logprobs (a boolean) and top_logprobs,
    a completion has logprobs (the number of alternatives)."""
    if kind == "chat":
        wants_logprobs = get.boolean("logprobs", False)
        top = get.integer("top_logprobs", 0, low=0, high=MAX_TOP_LOGPROBS)
        if top and not wants_logprobs:
            raise RequestError("top_logprobs needs logprobs to be true.", param="top_logprobs")
        return wants_logprobs, top
    top = get.integer("logprobs", None, low=0, high=MAX_TOP_LOGPROBS)
    return top is not None, top or 0


def _constraint(body: dict) -> Optional[Constraint]:
    """The request's constraint: OpenAI's response_format, or one of the CONSTRAINT_FIELDS; checked by the grammar
    engine, so that a schema feature it lacks or a regex that does not parse is a 400 naming it."""
    found = []
    response_format = body.get("response_format")
    if response_format is not None:
        if not isinstance(response_format, dict) or response_format.get("type") not in ("text", "json_object",
                                                                                          "json_schema"):
            raise RequestError("response_format must be {type: text}, {type: json_object} or {type: json_schema, "
                               "json_schema: {name, schema}}.", param="response_format")
        if response_format["type"] == "json_object":
            found.append(("response_format", Constraint.json_object()))
        elif response_format["type"] == "json_schema":
            spec = response_format.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
                raise RequestError("response_format.json_schema must be an object with a name and a schema.",
                                   param="response_format")
            found.append(("response_format", Constraint.json_schema(spec.get("schema") or {"type": "object"})))
    for name, kind in CONSTRAINT_FIELDS.items():
        if body.get(name) is not None:
            found.append((name, Constraint(kind, body[name])))
    if not found:
        return None
    if len(found) > 1:
        raise RequestError(f"one constraint per request: {found[0][0]} and {found[1][0]} were both given.",
                           param=found[1][0])
    name, constraint = found[0]
    try:
        problem = constraint_problem(constraint)
    except EdgeSpecdecError as exc:
        problem = str(exc)
    if problem:
        raise RequestError(f"{name}: {problem}", param=name)
    return constraint


class _Fields:
    """Typed reads of a request body's fields, each wrong type or range a RequestError naming the field."""

    def __init__(self, body: dict, prefix: str = ""):
        self.body, self.prefix = body, prefix

    def _get(self, name: str):
        return self.body.get(name)

    def boolean(self, name: str, default):
        value = self._get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise RequestError(f"{self.prefix}{name} must be true or false, not {value!r}.", param=name)
        return value

    def object(self, name: str) -> Optional[dict]:
        value = self._get(name)
        if value is not None and not isinstance(value, dict):
            raise RequestError(f"{self.prefix}{name} must be an object.", param=name)
        return value

    def number(self, name: str, default, low=None, high=None, low_open=False, integer=False):
        value = self._get(name)
        if value is None:
            return default
        if (isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int))
                or not math.isfinite(value)):
            raise RequestError(f"{self.prefix}{name} must be {'an integer' if integer else 'a finite number'}, not "
                               f"{value!r}.", param=name)
        too_low = low is not None and (value <= low if low_open else value < low)
        if too_low or (high is not None and value > high):
            bounds = (f"{'above' if low_open else 'at least'} {low}" if low is not None else "",
                      f"at most {high}" if high is not None else "")
            raise RequestError(f"{self.prefix}{name} must be {' and '.join(b for b in bounds if b)}, not {value}.",
                               param=name)
        return value

    def integer(self, name: str, default, low=None, high=None):
        return self.number(name, default, low, high, integer=True)


def _logit_bias(bias: Any) -> dict[int, float]:
    """OpenAI's logit_bias: an object of token ids (as strings, JSON's keys) to numbers from -100 to 100."""
    if bias is None:
        return {}
    if not isinstance(bias, dict):
        raise RequestError('logit_bias must be an object of token ids to numbers, such as {"15043": -100}.',
                           param="logit_bias")
    out = {}
    for key, value in bias.items():
        if not (key.isascii() and key.isdigit()):
            raise RequestError(f"logit_bias keys must be token ids written as whole numbers, not {key!r}.",
                               param="logit_bias")
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
            raise RequestError(f"logit_bias[{key}] must be a number from {-MAX_LOGIT_BIAS:g} to {MAX_LOGIT_BIAS:g}, "
                               f"not {value!r}.", param="logit_bias")
        out[int(key)] = float(value)
    return out


def _stop_strings(stop: Any) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise RequestError("stop must be a string or a list of strings.", param="stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise RequestError(f"stop takes at most {MAX_STOP_STRINGS} strings, not {len(stops)}.", param="stop")
    return [s for s in stops if s]


def _messages(messages: Any) -> list[dict]:
    """Chat messages as the chat template takes them: a role and the text content (text parts are joined); an
    assistant's tool calls (their arguments as objects, as templates read them) and a tool's answer too."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of {role, content} objects.", param="messages")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(f"messages[{i}] must be an object with a role and content.", param="messages")
        role, content = message["role"], message.get("content")
        if role not in CHAT_ROLES:
            raise RequestError(f"messages[{i}].role {role!r} is not supported: use system, developer, user, "
                               f"assistant or tool.", param="messages")
        calls = _tool_calls(i, message.get("tool_calls")) if role == "assistant" else None
        if calls and content is None:
            content = ""
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise RequestError(f"messages[{i}].content: only text parts are supported.", param="messages")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise RequestError(f"messages[{i}].content must be a string or a list of text parts.",
                               param="messages")
        entry = {"role": "system" if role == "developer" else role, "content": content}
        if calls:
            entry["tool_calls"] = calls
        if role == "tool" and isinstance(message.get("tool_call_id"), str):
            entry["tool_call_id"] = message["tool_call_id"]
        out.append(entry)
    return out


def _tool_calls(i: int, calls: Any) -> Optional[list[dict]]:
    """An assistant message's tool_calls as chat templates read them: arguments parsed from their JSON string."""
    if calls is None:
        return None
    if not isinstance(calls, list):
        raise RequestError(f"messages[{i}].tool_calls must be a list.", param="messages")
    out = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise RequestError(f"messages[{i}].tool_calls: each needs a function with a name.", param="messages")
        arguments = function.get("arguments", "{}")
        try:
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError:
            raise RequestError(f"messages[{i}].tool_calls: function.arguments must be a JSON string.",
                               param="messages") from None
        out.append({"id": call.get("id"), "type": "function",
                    "function": {"name": function["name"], "arguments": arguments}})
    return out


def _prompt(prompt: Any) -> str | list[int]:
    """One prompt: a string or a list of token ids (a list holding one of those is taken too)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise RequestError("the prompt is empty: give some text to continue.", param="prompt")
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        raise RequestError("one prompt per request: this server does not batch prompts in one request.",
                           param="prompt")
    raise RequestError("prompt must be a non-empty string or a list of token ids.", param="prompt")


def _extension(extension: Any) -> SpeculativeConfig:
    """The edge_specdec object: the request's speculative settings, checked by SpeculativeConfig, whose message
    (naming the field) the error carries."""
    if extension is None:
        return SpeculativeConfig()
    if not isinstance(extension, dict):
        raise RequestError("edge_specdec must be an object.", param="edge_specdec")
    unknown = sorted(set(extension) - EXTENSION_FIELDS)
    if unknown:
        raise RequestError(f"unrecognized edge_specdec field: {unknown[0]} (known: "
                           f"{', '.join(sorted(EXTENSION_FIELDS))}).", param="edge_specdec")
    try:
        speculative = SpeculativeConfig(**{k: v for k, v in extension.items() if v is not None})
    except EdgeSpecdecError as exc:
        raise RequestError(f"edge_specdec.{exc}", param="edge_specdec") from None
    if (speculative.num_assistant_tokens or 0) > MAX_ASSISTANT_TOKENS:  # a request's bound on its target passes
        raise RequestError(f"edge_specdec.num_assistant_tokens must be at most {MAX_ASSISTANT_TOKENS}, not "
                           f"{speculative.num_assistant_tokens}.", param="edge_specdec")
    return speculative


def parse_tokenize(body: Any) -> tuple[str, bool]:
    """llama-server's /tokenize body: {"content": text, "add_special": bool (default false)}."""
    _only_fields(body, {"content", "add_special"}, "/tokenize")
    content = body.get("content")
    if not isinstance(content, str):
        raise RequestError("content must be the text to tokenize, a string.", param="content")
    return content, _Fields(body).boolean("add_special", False)


def parse_detokenize(body: Any, vocabulary: int) -> list[int]:
    """llama-server's /detokenize body: {"tokens": [token ids]}, each id a token of the target."""
    _only_fields(body, {"tokens"}, "/detokenize")
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise RequestError("tokens must be a list of token ids.", param="tokens")
    if any(not 0 <= t < vocabulary for t in tokens):
        raise RequestError(f"token ids must be between 0 and {vocabulary - 1}.", param="tokens")
    return tokens


def _only_fields(body: Any, known: set[str], endpoint: str) -> None:
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object.")
    unknown = sorted(set(body) - known)
    if unknown:
        raise RequestError(f"unrecognized {endpoint} argument: {unknown[0]} (known: {', '.join(sorted(known))}).",
                           param=unknown[0])


# --- the body --------------------------------------------------------------------------------------------------

def decode_json(body: bytes) -> Any:
    """A request body as JSON, refused with a RequestError when it is not JSON as RFC 8259 defines it (Python's
    parser also takes NaN and Infinity, and reads 1e400 as inf), nests past what the parser can follow, or holds a
    string with a lone surrogate ("\\ud800": not text; the tokenizer fails on it, and so would the answer)."""
    too_deep = RequestError(f"the request body nests too deeply to be read (at most {MAX_JSON_DEPTH} levels).")
    try:
        value = json.loads(body, parse_constant=_not_json_number, parse_float=_finite_float)
    except RequestError:
        raise
    except RecursionError:
        raise too_deep from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"the request body is not valid JSON: {exc}.") from None
    if json_depth(value) > MAX_JSON_DEPTH:  # what the parser took, later code (a repr in a message) may not
        raise too_deep
    where = lone_surrogate(value)
    if where:
        field_name = None if where.startswith(("a field name", "the request body")) else re.split(r"[.\[]", where)[0]
        raise RequestError(f"{where} holds a lone surrogate (a \\ud800-\\udfff escape without its pair), which "
                           f"is not text: send the characters themselves.", param=field_name)
    return value


def _not_json_number(name: str):
    raise RequestError(f"the request body holds {name}, which is not a JSON number: send finite numbers.")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise RequestError(f"the number {text[:40]} in the request body is out of range: send finite numbers.")
    return value


def json_depth(value: Any) -> int:
    """How deep a decoded JSON value nests (a scalar 0, [] 1, [[1]] 2), walked with a stack, not recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth + 1)
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def lone_surrogate(value: Any) -> Optional[str]:
    """Where in a decoded JSON value a string (a key or a value) holds a lone surrogate: "messages[0].content", or
    None. Walked with a stack, not recursion: the value may nest as deep as the parser allowed."""
    stack: list[tuple[str, Any]] = [("the request body", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if not _is_text(item):
                return path
        elif isinstance(item, dict):
            for key, child in item.items():
                child_path = key if path == "the request body" else f"{path}.{key}"
                if not _is_text(key):
                    return f"a field name in {path}"
                stack.append((child_path, child))
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", child) for i, child in enumerate(item))
    return None


def _is_text(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# --- responses ------------------------------------------------------------------------------------------------

class Responder:
    """Builds one request's response objects and stream chunks in OpenAI's shapes."""

    def __init__(self, request: ParsedRequest, model: str, token_text: Callable[[int], bytes]):
        self.request, self.model, self.token_bytes = request, model, token_text
        self.chat = request.kind == "chat"
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.offset = 0  # characters of completion text before the next logprob entry (completions' text_offset)
        self.content: Optional[str] = None  # a chat answer with tool calls: the text before them, and the calls
        self.tool_calls: list[dict] = []

    def _head(self, chunk: bool) -> dict:
        obj = "chat.completion.chunk" if chunk and self.chat else "chat.completion" if self.chat else "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def response(self, result: Result, prompt_tokens: int) -> dict:
        """The whole completion (stream false)."""
        logprobs = self.logprobs(result.logprobs) if result.logprobs is not None else None
        reason = FINISH_REASONS.get(result.stop_reason, "stop")
        if self.chat:
            message = {"role": "assistant", "content": result.text, "refusal": None}
            if self.tool_calls:
                message.update(content=self.content, tool_calls=self.tool_calls)
                reason = "tool_calls"
            choice = {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": result.text, "logprobs": logprobs, "finish_reason": reason}
        return {**self._head(False), "choices": [choice], "usage": usage(prompt_tokens, result),
                "edge_specdec": run_summary(result)}

    def first_chunk(self) -> Optional[dict]:
        """The chunk that opens a chat stream (the assistant's role), as OpenAI sends it."""
        if not self.chat:
            return None
        return {**self._head(True), "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                 "logprobs": None, "finish_reason": None}]}

    def text_chunk(self, text: str, source: str, tokens: int, logprobs: list[TokenLogprob]) -> dict:
        """A chunk of streamed text from one source ("draft", "grammar" or "target"); logprobs: those of the
        tokens it completes."""
        lp = self.logprobs(logprobs) if self.request.config.wants_logprobs else None
        part = {"delta": {"content": text}} if self.chat else {"text": text}
        return {**self._head(True), "choices": [{"index": 0, **part, "logprobs": lp, "finish_reason": None}],
                "edge_specdec": {"source": source, "tokens": tokens}}

    def progress_chunk(self, progress: PrefillProgress) -> dict:
        """A chunk without text that says where a long prompt's prefill stands (return_progress), as llama-server
        sends it: the prompt's tokens in all, those reused from the cache, those in the cache so far, the ms since
        the run started."""
        part = {"delta": {}} if self.chat else {"text": ""}
        return {**self._head(True), "choices": [{"index": 0, **part, "logprobs": None, "finish_reason": None}],
                "prompt_progress": {"total": progress.total, "cache": progress.cached, "processed": progress.done,
                                    "time_ms": round(1000 * progress.seconds)}}

    def tool_calls_chunk(self, calls: list[dict], logprobs: list[TokenLogprob]) -> dict:
        """The calls of a streamed answer, each whole in one delta (index, id, name and arguments); logprobs: those
        of the calls' tokens."""
        delta = {"tool_calls": [{"index": i, **call} for i, call in enumerate(calls)]}
        lp = self.logprobs(logprobs) if self.request.config.wants_logprobs else None
        return {**self._head(True), "choices": [{"index": 0, "delta": delta, "logprobs": lp,
                                                 "finish_reason": None}]}

    def last_chunk(self, result: Result, logprobs: list[TokenLogprob]) -> dict:
        """The chunk with the finish reason and the run's statistics (and the logprobs of tokens no text chunk
        carried, such as the end-of-sequence token)."""
        lp = self.logprobs(logprobs) if self.request.config.wants_logprobs else None
        part = {"delta": {}} if self.chat else {"text": ""}
        reason = "tool_calls" if self.tool_calls else FINISH_REASONS.get(result.stop_reason, "stop")
        return {**self._head(True), "choices": [{"index": 0, **part, "logprobs": lp, "finish_reason": reason}],
                "edge_specdec": run_summary(result)}

    def usage_chunk(self, result: Result, prompt_tokens: int) -> dict:
        return {**self._head(True), "choices": [], "usage": usage(prompt_tokens, result)}

    def logprobs(self, entries: list[TokenLogprob]) -> dict:
        """Logprob entries in the endpoint's format: chat's `content` list, or the completions' four lists."""
        def text(token: int) -> str:
            return self.token_bytes(token).decode("utf-8", "replace")

        if self.chat:
            return {"content": [{"token": text(e.token), "logprob": e.logprob, "bytes": list(self.token_bytes(e.token)),
                                 "top_logprobs": [{"token": text(t), "logprob": v, "bytes": list(self.token_bytes(t))}
                                                  for t, v in e.top]} for e in entries], "refusal": None}
        offsets = []
        for e in entries:
            offsets.append(self.offset)
            self.offset += len(text(e.token))
        return {"tokens": [text(e.token) for e in entries], "token_logprobs": [e.logprob for e in entries],
                "top_logprobs": [{text(t): v for t, v in e.top} for e in entries] if self.request.config.top_logprobs
                else None, "text_offset": offsets}


def usage(prompt_tokens: int, result: Result) -> dict:
    """OpenAI's usage object; cached_tokens: the prompt tokens whose KV the slot kept from earlier requests;
    context_shift (a chat shifted by --context-shift only): the messages dropped and the prompt tokens prefilled."""
    completion = len(result.token_ids)
    shifted = {"context_shift": result.extra["context_shift"]} if "context_shift" in result.extra else {}
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": result.stats.prompt_tokens_reused}, **shifted}


def run_summary(result: Result) -> dict:
    """The run's speculative statistics: what the draft proposed, what the target accepted, its passes; and
    drafting_note, why it drafted less (Stats.drafting_note: the sentence the CLI prints), shown by the page;
    context_shift, when --context-shift dropped messages: how many, and the prompt tokens prefilled again."""
    stats = result.stats.as_dict()
    keep = ("draft_tokens_proposed", "draft_tokens_accepted", "target_passes", "mean_tokens_per_target_pass",
            "acceptance", "tokens_per_s", "first_token_seconds", "time_per_output_token_ms", "seconds",
            "prompt_tokens_reused", "prompt_tokens_prefilled", "rounds_drafting_paused", "grammar_tokens_proposed",
            "grammar_tokens_accepted", "suffix_tokens_proposed", "suffix_tokens_accepted", "pool_tokens_proposed",
            "pool_tokens_accepted")
    return {"algorithm": result.extra.get("algorithm"), "exact": result.exact, "stop_reason": result.stop_reason,
            **{k: stats[k] for k in keep}, "drafting_note": result.stats.drafting_note,
            **{k: result.extra[k] for k in ("context_shift",) if k in result.extra}}
