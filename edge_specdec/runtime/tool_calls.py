"""Tool calls (OpenAI's `tools`): how a model family writes a call, the grammar that holds its calls to the tools'
parameter schemas, and reading the calls back out of the generated text.

A family's format is found from its chat template (the text the template tells the model to write). Today one
family: Qwen2.5 and the Hermes-style templates, which write each call as
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`. The grammar follows `tool_choice`: "required"
or a named function, calls only; "auto", any text without the opening tag, or text up to it and then calls (the
grammar is free until the model opens a call, and holds the call to a schema from there).
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Optional, Union

from ..errors import EdgeSpecdecError
from .constraint import JSON_LAYOUT, Constraint
from .grammar import constraint_problem


@dataclass(frozen=True)
class ToolFormat:
    name: str
    open: str   # the text before each call's JSON
    close: str  # the text after it
    between: str = "\n"  # between two calls

    def grammar(self, tools: list[dict], choice: Union[str, dict], parallel: bool) -> Constraint:
        """The Lark grammar for tool_choice `choice` ("auto", "required" or {"type": "function", ...})."""
        if isinstance(choice, dict):
            name = choice["function"]["name"]
            tools = [t for t in tools if t["function"]["name"] == name]
        schema = {"anyOf": [call_schema(t["function"]) for t in tools], "x-guidance": JSON_LAYOUT}
        call = f"%json {json.dumps(schema)} {lark_string(self.close)}"
        more = f"({lark_string(self.between + self.open)} {call})*" if parallel else ""
        if choice == "auto":  # text without the tag, or text up to the first tag and then calls
            tag = regex_text(self.open)
            lines = [f"start: TEXT | OPEN {call} {more}",
                     f"TEXT: /(?s:.*)/ & ~/(?s:.*){tag}(?s:.*)/",
                     f"OPEN: /(?s:.*){tag}/ & ~/(?s:.*){tag}(?s:.+)/"]
        else:
            lines = [f"start: {lark_string(self.open)} {call} {more}"]
        return Constraint.grammar("\n".join(lines))

    def parse(self, text: str) -> tuple[Optional[str], list[dict]]:
        """The text before the first call (None when empty) and the calls, in OpenAI's shape (arguments as a JSON
        string); no calls when the text holds none that reads as one (it is then all content)."""
        start = text.find(self.open)
        if start < 0:
            return text, []
        calls, position = [], start
        while True:
            begin = text.find(self.open, position)
            if begin < 0:
                break
            end = text.find(self.close, begin + len(self.open))
            if end < 0:
                break
            try:
                call = json.loads(text[begin + len(self.open):end])
            except ValueError:
                return text, []
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                return text, []
            calls.append({"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                          "function": {"name": call["name"],
                                       "arguments": json.dumps(call.get("arguments", {}), ensure_ascii=False)}})
            position = end + len(self.close)
        if not calls:
            return text, []
        content = text[:start].rstrip()
        return content or None, calls


FORMATS = [ToolFormat("hermes", "<tool_call>\n", "\n</tool_call>")]


def tool_format(template_source: Optional[str]) -> Optional[ToolFormat]:
    """The tool-call format a chat template teaches its model, or None (the template knows no tools)."""
    if not template_source or "tools" not in template_source:
        return None
    return next((f for f in FORMATS if f.open.strip() in template_source), None)


def call_schema(function: dict) -> dict:
    """A call of one function: {"name": its name, "arguments": an object its parameters' schema allows}."""
    parameters = function.get("parameters") or {"type": "object", "properties": {}}
    return {"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
            "properties": {"name": {"const": function["name"]}, "arguments": parameters}}


def lark_string(text: str) -> str:
    return json.dumps(text)


def regex_text(text: str) -> str:
    """text as a regular expression that matches it literally, inside Lark's /.../."""
    special = set("\\.^$|?*+()[]{}/")
    return "".join("\\n" if c == "\n" else "\\" + c if c in special else c for c in text)


def check_tools(tools: Any, choice: Any) -> tuple[list[dict], Union[str, dict]]:
    """OpenAI's tools and tool_choice, checked: a list of {"type": "function", "function": {"name", "description",
    "parameters"}} and "none", "auto", "required" or {"type": "function", "function": {"name"}}."""
    if not isinstance(tools, list) or not tools:
        raise EdgeSpecdecError("tools must be a non-empty list of {type: function, function: {...}} objects.")
    names = set()
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
            raise EdgeSpecdecError(f"tools[{i}] must be {{type: function, function: {{name, parameters}}}}.")
        name = function.get("name")
        if not isinstance(name, str) or not name or len(name) > 64 or not all(c.isalnum() or c in "_-" for c in name):
            raise EdgeSpecdecError(f"tools[{i}].function.name must be 1-64 letters, digits, _ or - (got {name!r}).")
        if name in names:
            raise EdgeSpecdecError(f"tools[{i}].function.name {name!r} is given twice.")
        names.add(name)
        parameters = function.get("parameters")
        if parameters is not None and (not isinstance(parameters, dict)
                                       or parameters.get("type", "object") != "object"):
            raise EdgeSpecdecError(f"tools[{i}].function.parameters must be a JSON schema of an object.")
        if parameters is not None:
            problem = constraint_problem(Constraint.json_schema(parameters))
            if problem:
                raise EdgeSpecdecError(f"tools[{i}].function.parameters: {problem}")
    choice = "auto" if choice is None else choice
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
        if not isinstance(name, str):
            raise EdgeSpecdecError("tool_choice must be none, auto, required or {type: function, function: {name}}.")
        if name not in names:
            raise EdgeSpecdecError(f"tool_choice names the function {name!r}, which is not among the tools.")
    elif choice not in ("none", "auto", "required"):
        raise EdgeSpecdecError(f"tool_choice must be none, auto, required or {{type: function, function: {{name}}}}, "
                               f"not {choice!r}.")
    return tools, choice
