"""What structured output asks for: a `Constraint` (a JSON schema, any JSON object, a regular expression, a Lark or
GBNF grammar), the data a GenerationConfig carries, and its translation to llguidance's grammar text.

Compiling it against a vocabulary and enforcing it as tokens are proposed and verified is grammar.py's job, a layer
up (docs/architecture.md); `grammar.constraint_problem` says whether a constraint can be used at all. Keeping the
data here lets sampling.py, the bottom of the runtime, hold a constraint without depending on the grammar engine.
llguidance is imported only when a constraint is translated.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Union

from ..errors import EdgeSpecdecError

KINDS = ("json_schema", "json_object", "regex", "grammar")
# JSON is written on one line, with ", " and ": " between items (a schema's "x-guidance" may say otherwise): the
# grammar then fixes every byte between the values, which the loop proposes without the draft, and a model cannot
# loop on whitespace
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class Constraint:
    """What the output must match: one of KINDS and its text. json_schema: a JSON schema (a dict, or its JSON
    text); json_object: any JSON object (no spec); regex: a regular expression the whole output matches;
    grammar: a Lark grammar (llguidance's dialect, `start:` its first rule) or a GBNF one (`root ::= ...`)."""
    kind: str
    spec: Union[str, dict, None] = None

    @classmethod
    def json_schema(cls, schema: Union[str, dict]) -> "Constraint":
        return cls("json_schema", schema)

    @classmethod
    def json_object(cls) -> "Constraint":
        return cls("json_object")

    @classmethod
    def regex(cls, pattern: str) -> "Constraint":
        return cls("regex", pattern)

    @classmethod
    def grammar(cls, text: str) -> "Constraint":
        return cls("grammar", text)

    def check(self) -> None:
        """Refuse a constraint of the wrong shape (what it means is checked when it is compiled)."""
        if self.kind not in KINDS:
            raise EdgeSpecdecError(f"unknown constraint kind {self.kind!r}: use one of {', '.join(KINDS)}.")
        if self.kind == "json_object":
            return
        if self.kind == "json_schema":
            if isinstance(self.spec, str):
                try:
                    schema = json.loads(self.spec)
                except ValueError as e:
                    raise EdgeSpecdecError(f"the JSON schema is not valid JSON: {e}.") from None
            else:
                schema = self.spec
            if not isinstance(schema, dict):
                raise EdgeSpecdecError(f"a JSON schema must be a JSON object, not {type(schema).__name__}.")
        elif not isinstance(self.spec, str) or not self.spec.strip():
            raise EdgeSpecdecError(f"a {self.kind} constraint needs its text (got {self.spec!r}).")

    def llguidance_grammar(self) -> str:
        """The constraint as an llguidance grammar (its JSON form); nothing is compiled yet."""
        from llguidance import LLMatcher

        self.check()
        if self.kind in ("json_object", "json_schema"):
            schema = {"type": "object"} if self.kind == "json_object" else self.spec
            return LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT)
        if self.kind == "regex":
            return LLMatcher.grammar_from_regex(self.spec)
        text = self.spec
        if "::=" in text and "start:" not in text:  # GBNF, as llama.cpp writes it
            from llguidance.gbnf_to_lark import gbnf_to_lark
            try:
                text = gbnf_to_lark(text)
            except Exception as e:  # the converter raises plain exceptions for syntax it cannot read
                raise EdgeSpecdecError(f"the GBNF grammar could not be read: {e}") from None
        return LLMatcher.grammar_from_lark(text)
