"""edge_specdec.benchmark.prompt_file: a user's prompt file (plain text, JSON lines, prompts.json shape) read
into the prompt-set shape, and every malformed file refused with one line naming the file, the place and the fix."""
from __future__ import annotations

import json

import pytest

from edge_specdec.benchmark import load_prompt_set
from edge_specdec.benchmark.prompt_file import read_prompt_file
from edge_specdec.errors import EdgeSpecdecError


def write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def refused(path) -> str:
    """The error message for a file the reader must refuse; it is one line and names the file."""
    with pytest.raises(EdgeSpecdecError) as info:
        read_prompt_file(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message, message
    return message


# --- the accepted forms -----------------------------------------------------------------------------------------

def test_plain_text_is_one_prompt_per_line_with_blank_lines_ignored(tmp_path):
    path = write(tmp_path, "mine.txt", "Write a haiku about rain.\n\n   \nTranslate 'hello' to French.\r\nLast one")
    assert read_prompt_file(path) == {"custom": [
        {"id": "custom-1", "text": "Write a haiku about rain."},
        {"id": "custom-2", "text": "Translate 'hello' to French."},
        {"id": "custom-3", "text": "Last one"}]}


def test_plain_text_may_hold_braces_and_json_that_is_not_an_object(tmp_path):
    # A line that does not parse, or parses to a non-object, is a prompt like any other.
    lines = ["Explain {curly braces} in Python f-strings.", "42", '["a", "list"]', "{not json at all"]
    prompt_set = read_prompt_file(write(tmp_path, "mine.txt", "\n".join(lines)))
    assert [p["text"] for p in prompt_set["custom"]] == lines


def test_json_lines_take_category_and_id_and_default_both(tmp_path):
    lines = [{"text": "a", "category": "chat", "id": "greeting"},
             {"text": "b", "category": "chat"},
             {"text": "c"},
             {"text": "d", "category": "math", "id": "sum"},
             {"text": "e", "category": "chat"}]
    path = write(tmp_path, "mine.jsonl", "\n".join(json.dumps(line) for line in lines) + "\n\n")
    prompt_set = read_prompt_file(path)
    assert list(prompt_set) == ["chat", "custom", "math"]   # in the order of first appearance
    assert prompt_set["chat"] == [{"id": "greeting", "text": "a"}, {"id": "chat-2", "text": "b"},
                                  {"id": "chat-3", "text": "e"}]
    assert prompt_set["custom"] == [{"id": "custom-1", "text": "c"}]
    assert prompt_set["math"] == [{"id": "sum", "text": "d"}]


def test_json_lines_keep_the_text_exactly(tmp_path):
    text = "  Fix this:\n\n```python\ndef f(x):\n    return x\n```  "
    path = write(tmp_path, "mine.jsonl", json.dumps({"text": text}))   # one line, whatever the suffix
    assert read_prompt_file(path) == {"custom": [{"id": "custom-1", "text": text}]}


def test_the_shipped_prompt_set_reads_as_its_categories():
    from edge_specdec.benchmark.prompt_set import PROMPTS_FILE
    shipped = json.loads(PROMPTS_FILE.read_text(encoding="utf-8"))["categories"]
    assert read_prompt_file(PROMPTS_FILE) == shipped
    assert load_prompt_set() == shipped   # the bench's loader reads it through the same reader


def test_a_json_file_of_the_prompt_set_shape_numbers_missing_ids(tmp_path):
    data = {"categories": {"mine": [{"id": "x", "text": "one"}, {"text": "two"}], "other": [{"text": "three"}]}}
    path = write(tmp_path, "set.json", json.dumps(data, indent=2))
    assert read_prompt_file(path) == {"mine": [{"id": "x", "text": "one"}, {"id": "mine-2", "text": "two"}],
                                      "other": [{"id": "other-1", "text": "three"}]}


def test_a_single_json_object_in_a_json_file_is_one_json_line(tmp_path):
    path = write(tmp_path, "one.json", json.dumps({"text": "only", "category": "c"}))
    assert read_prompt_file(path) == {"c": [{"id": "c-1", "text": "only"}]}


# --- the refused files ------------------------------------------------------------------------------------------

def test_a_missing_file_is_named(tmp_path):
    assert "does not exist" in refused(tmp_path / "nowhere.txt")


@pytest.mark.parametrize("text", ["", "\n\n  \n"])
def test_an_empty_file_is_refused(tmp_path, text):
    assert "empty" in refused(write(tmp_path, "empty.txt", text))


def test_a_bad_json_line_names_its_line(tmp_path):
    text = '{"text": "fine"}\n\n{"text": "broken",\n{"text": "fine too"}\n'
    message = refused(write(tmp_path, "bad.jsonl", text))
    assert "line 3" in message and "bad JSON line" in message


def test_plain_text_among_json_lines_names_the_plain_line(tmp_path):
    message = refused(write(tmp_path, "mixed.jsonl", '{"text": "a"}\n{"text": "b"}\njust words\n'))
    assert "line 3" in message and "plain text in a JSON-lines file" in message


def test_a_json_object_among_plain_lines_names_the_object_line(tmp_path):
    message = refused(write(tmp_path, "mixed.txt", 'just words\nmore words\n\n{"text": "an object"}\n'))
    assert "line 4" in message and "JSON object in a plain-text file" in message


@pytest.mark.parametrize("line, problem", [
    ('{"category": "chat"}', 'no "text"'),
    ('{"text": 7}', '"text" must be a non-empty string'),
    ('{"text": "   "}', '"text" must be a non-empty string'),
    ('{"text": "ok", "category": ""}', '"category" must be a non-empty string'),
    ('{"text": "ok", "id": 3}', '"id" must be a non-empty string'),
])
def test_a_json_line_without_a_usable_text_category_or_id_names_its_line(tmp_path, line, problem):
    message = refused(write(tmp_path, "bad.jsonl", '{"text": "fine"}\n' + line + "\n"))
    assert "line 2" in message and problem in message


def test_duplicate_ids_name_both_places(tmp_path):
    text = '{"text": "a", "id": "p"}\n{"text": "b", "category": "other", "id": "q"}\n{"text": "c", "id": "p"}\n'
    message = refused(write(tmp_path, "dup.jsonl", text))
    assert "duplicate id 'p'" in message and "line 3" in message and "line 1" in message


def test_an_explicit_id_that_collides_with_a_numbered_one_is_a_duplicate(tmp_path):
    text = '{"text": "a", "id": "custom-2"}\n{"text": "b"}\n'
    message = refused(write(tmp_path, "dup.jsonl", text))
    assert "duplicate id 'custom-2'" in message and "line 2" in message


def test_a_json_file_with_a_syntax_error_names_the_line(tmp_path):
    text = '{\n  "categories": {\n    "mine": [\n      {"id": "a", "text": "one"},\n    ]\n  }\n}\n'
    message = refused(write(tmp_path, "set.json", text))
    assert "line 5" in message and "not valid JSON" in message


@pytest.mark.parametrize("data, problem", [
    ({"prompts": []}, '"categories"'),
    ({"categories": {}}, "non-empty object"),
    ({"categories": {"mine": []}}, "category 'mine'"),
    ({"categories": {"mine": ["a string"]}}, "category 'mine', prompt 1"),
    ({"categories": {"mine": [{"id": "a", "text": "x"}, {"id": "b"}]}}, "category 'mine', prompt 2"),
    ({"categories": {"m": [{"id": "a", "text": "x"}], "n": [{"id": "a", "text": "y"}]}}, "duplicate id 'a'"),
])
def test_a_malformed_prompt_set_file_names_the_place(tmp_path, data, problem):
    assert problem in refused(write(tmp_path, "set.json", json.dumps(data)))
