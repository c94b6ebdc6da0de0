"""Read a user's prompt file into the prompt-set shape the bench uses: {category: [{"id", "text"}, ...]}.

Three forms are accepted, told apart by the file's content (and its .json suffix):

* plain text: one prompt per line, blank lines ignored; every prompt is in the category "custom";
* JSON lines: every non-blank line an object {"text": ..., optional "category": ..., optional "id": ...};
* a .json file shaped like the shipped prompts.json: {"categories": {category: [{"id", "text"}, ...]}}.

A missing category is "custom"; a missing id is "<category>-<n>", n counting that category's prompts from 1.
Every problem raises EdgeSpecdecError with one line naming the file, where in it, and the fix.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Optional, Union

from ..errors import EdgeSpecdecError

DEFAULT_CATEGORY = "custom"
EXAMPLE_LINE = '{"text": "Summarize ...", "category": "summarization", "id": "s1"}'


def read_prompt_file(path: Union[str, Path]) -> dict[str, list[dict[str, str]]]:
    """{category: [{"id", "text"}, ...]} from a plain-text, JSON-lines or prompts.json-shaped file."""
    path = Path(path)
    text = _read_text(path)
    if not text.strip():
        raise EdgeSpecdecError(f"prompt file {path} is empty: write one prompt per line, "
                               f"or one JSON object per line like {EXAMPLE_LINE}.")
    whole = _parse_whole(path, text)
    if whole is not None:
        return _from_prompt_set(path, whole)
    lines = [(number, line) for number, line in enumerate(text.splitlines(), start=1) if line.strip()]
    objects = {number: parsed for number, parsed in ((n, _json_object(line)) for n, line in lines)
               if parsed is not None}
    if len(objects) == len(lines):
        return _from_json_lines(path, lines, objects)
    if objects:
        raise _mixed_lines_error(path, lines, objects)
    return _collect(path, [(f"line {number}", DEFAULT_CATEGORY, None, line.strip()) for number, line in lines])


def describe_prompt_file(path: Union[str, Path], prompt_set: dict[str, list[dict[str, str]]]) -> dict[str, Any]:
    """What a report records of a prompt file read by read_prompt_file: its path as given, the sha256 of its bytes
    (so that a later run can tell whether it used the same prompts) and how many prompts per category it holds."""
    return {"path": str(path), "sha256": hashlib.sha256(Path(path).read_bytes()).hexdigest(),
            "prompts": sum(len(items) for items in prompt_set.values()),
            "categories": {category: len(items) for category, items in prompt_set.items()}}


# --- reading and telling the forms apart ----------------------------------------------------------------------

def _read_text(path: Path) -> str:
    if not path.is_file():
        raise EdgeSpecdecError(f"prompt file {path} does not exist (or is not a file): check the path.")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise EdgeSpecdecError(f"prompt file {path} is not UTF-8 text ({exc.reason} at byte {exc.start}): "
                               "save it as UTF-8.") from None
    except OSError as exc:
        raise EdgeSpecdecError(f"cannot read prompt file {path}: {exc.strerror or exc}.") from None


def _parse_whole(path: Path, text: str) -> Optional[dict]:
    """The file as one JSON document when it is the prompts.json shape; None when it is meant as lines.

    A .json file must be that shape (a syntax error there is reported, not read as plain text); any other
    file is that shape only when it parses whole into an object with "categories".
    """
    try:
        data = json.loads(text)
    except ValueError as exc:
        if path.suffix.lower() == ".json":
            where = f"line {exc.lineno}" if isinstance(exc, json.JSONDecodeError) else "its JSON"
            raise EdgeSpecdecError(f"prompt file {path}, {where}: not valid JSON ({_reason(exc)}): fix it, or "
                                   "rename the file to .jsonl/.txt if it holds one prompt per line.") from None
        return None
    if isinstance(data, dict) and "categories" in data:
        return data
    if path.suffix.lower() == ".json" and not (isinstance(data, dict) and "text" in data):
        raise EdgeSpecdecError(f'prompt file {path}: a .json prompt file must be an object with "categories" '
                               '({"categories": {"my_category": [{"id": "p1", "text": "..."}]}}), '
                               "like the shipped prompts.json; or write JSON lines in a .jsonl file.")
    return None   # a one-line JSON-lines file: read it as lines below


def _json_object(line: str) -> Optional[dict]:
    """The line as a JSON object, or None when it is not one (plain text, or JSON that is not an object)."""
    try:
        parsed = json.loads(line)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _reason(exc: ValueError) -> str:
    return exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)


def _mixed_lines_error(path: Path, lines: list[tuple[int, str]], objects: dict[int, dict]) -> EdgeSpecdecError:
    """Some lines are JSON objects and some are not: name the line that breaks the file's form."""
    first_object = min(objects)
    not_objects = [(number, line) for number, line in lines if number not in objects]
    # A line that starts like an object but does not parse is a broken JSON line: give the parser's reason.
    for number, line in not_objects:
        if line.lstrip().startswith("{"):
            try:
                json.loads(line)
                reason = "it is not a JSON object"
            except ValueError as exc:
                reason = _reason(exc)
            return EdgeSpecdecError(f"prompt file {path}, line {number}: bad JSON line ({reason}) while line "
                                    f"{first_object} is a JSON object: fix it, e.g. {EXAMPLE_LINE}.")
    first_plain = not_objects[0][0]
    if first_object < first_plain:
        return EdgeSpecdecError(f"prompt file {path}, line {first_plain}: plain text in a JSON-lines file (line "
                                f"{first_object} is a JSON object): write it as {{\"text\": ...}}, "
                                "or make every line plain text.")
    return EdgeSpecdecError(f"prompt file {path}, line {first_object}: a JSON object in a plain-text file (line "
                            f"{first_plain} is plain text): write every line as a JSON object, "
                            "or make every line plain text.")


# --- the two structured forms ---------------------------------------------------------------------------------

def _from_json_lines(path: Path, lines: list[tuple[int, str]], objects: dict[int, dict]) -> dict:
    entries = []
    for number, _ in lines:
        item = objects[number]
        where = f"line {number}"
        category = item.get("category", DEFAULT_CATEGORY)
        if not isinstance(category, str) or not category.strip():
            raise EdgeSpecdecError(f'prompt file {path}, {where}: "category" must be a non-empty string '
                                   f'(got {category!r}): fix it, or leave it out for "{DEFAULT_CATEGORY}".')
        entries.append((where, category, item.get("id"), _text_of(path, where, item)))
    return _collect(path, entries)


def _from_prompt_set(path: Path, data: dict) -> dict:
    categories = data["categories"]
    shape = '{"categories": {"my_category": [{"id": "p1", "text": "..."}]}}'
    if not isinstance(categories, dict) or not categories:
        raise EdgeSpecdecError(f'prompt file {path}: "categories" must be a non-empty object of lists, '
                               f"like {shape}.")
    entries = []
    for category, items in categories.items():
        if not isinstance(items, list) or not items:
            raise EdgeSpecdecError(f'prompt file {path}, category {category!r}: must be a non-empty list of '
                                   f'{{"id", "text"}} objects: add prompts or remove the category.')
        for position, item in enumerate(items, start=1):
            where = f"category {category!r}, prompt {position}"
            if not isinstance(item, dict):
                raise EdgeSpecdecError(f'prompt file {path}, {where}: must be an object {{"id": ..., "text": ...}} '
                                       f"(got {type(item).__name__}): fix it.")
            entries.append((where, category, item.get("id"), _text_of(path, where, item)))
    return _collect(path, entries)


def _text_of(path: Path, where: str, item: dict[str, Any]) -> str:
    text = item.get("text")
    if not isinstance(text, str) or not text.strip():
        problem = 'has no "text"' if "text" not in item else f'"text" must be a non-empty string (got {text!r:.40})'
        raise EdgeSpecdecError(f'prompt file {path}, {where}: {problem}: give every prompt a "text" string.')
    return text


# --- ids and the result ---------------------------------------------------------------------------------------

def _collect(path: Path, entries: list[tuple[str, str, Any, str]]) -> dict[str, list[dict[str, str]]]:
    """Group (where, category, id or None, text) into the prompt set, numbering missing ids; ids are unique."""
    prompt_set: dict[str, list[dict[str, str]]] = {}
    seen: dict[str, str] = {}   # id -> where it first appeared
    for where, category, prompt_id, text in entries:
        prompts = prompt_set.setdefault(category, [])
        if prompt_id is None:
            prompt_id = f"{category}-{len(prompts) + 1}"
        elif not isinstance(prompt_id, str) or not prompt_id.strip():
            raise EdgeSpecdecError(f'prompt file {path}, {where}: "id" must be a non-empty string '
                                   f"(got {prompt_id!r}): fix it, or leave it out to number the prompt.")
        if prompt_id in seen:
            raise EdgeSpecdecError(f"prompt file {path}, {where}: duplicate id {prompt_id!r} (first at "
                                   f"{seen[prompt_id]}): give each prompt its own id.")
        seen[prompt_id] = where
        prompts.append({"id": prompt_id, "text": text})
    return prompt_set
