"""The prompts a benchmark runs (and align measures a draft on): the shipped prompts.json or a user's prompt file,
the categories chosen, and each prompt rendered in the target's chat template for every engine."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from ..errors import EdgeSpecdecError
from .prompt_file import describe_prompt_file, read_prompt_file

PROMPTS_FILE = Path(__file__).with_name("prompts.json")


@dataclass
class Prompt:
    """One prompt, ready for every engine."""
    id: str
    category: str
    messages: list[dict[str, str]]
    text: str  # what the peers get: the chat-rendered text, or the raw prompt
    ours: Any  # what our Pipeline gets: token ids from pipe.chat_prompt, or the raw text

    @property
    def key(self) -> str:
        return f"{self.category}/{self.id}"


def load_prompt_set(path: Union[str, Path, None] = None) -> dict[str, list[dict[str, str]]]:
    """{category: [{"id", "text"}, ...]} from the shipped prompts.json, or from a user's prompt file (--prompts:
    plain text, JSON lines or the prompts.json shape; see prompt_file.py), through the one reader of both."""
    return read_prompt_file(path if path else PROMPTS_FILE)


def prompt_source(path: Union[str, Path, None], prompt_set: dict) -> Optional[dict[str, Any]]:
    """The report's record of where the prompts came from: None for the shipped set, else the file's path,
    sha256 and prompt counts."""
    return describe_prompt_file(path, prompt_set) if path else None


CATEGORIES = tuple(load_prompt_set())


def pick_categories(prompt_set: dict, categories: Optional[Sequence[str]]) -> list[str]:
    """The categories asked for (default: all), each once, in the order given; an unknown one is an error."""
    if not categories:
        return list(prompt_set)
    unknown = [c for c in categories if c not in prompt_set]
    if unknown:
        raise EdgeSpecdecError(f"unknown prompt categor{'ies' if len(unknown) > 1 else 'y'} "
                               f"{', '.join(map(repr, unknown))}: choose from {', '.join(prompt_set)}.")
    return list(dict.fromkeys(categories))


def pick_prompt_items(prompt_set: dict, categories: list[str], n: int) -> tuple[list[tuple[str, dict]], list[str]]:
    """n distinct prompts: round-robin over the chosen categories, then over the others when those run out."""
    def round_robin(cats: list[str]) -> list[tuple[str, dict]]:
        queues = [[(c, item) for item in prompt_set[c]] for c in cats]
        out = []
        for i in range(max((len(q) for q in queues), default=0)):
            out += [q[i] for q in queues if i < len(q)]
        return out

    items = round_robin(categories)
    notes = []
    if len(items) < n:
        others = [c for c in prompt_set if c not in categories]
        borrowed = round_robin(others)[:n - len(items)]
        if len(items) + len(borrowed) < n:
            total = sum(len(v) for v in prompt_set.values())
            raise EdgeSpecdecError(f"--clients {n} needs {n} distinct prompts, but the prompt set has {total}: "
                                   f"use at most {total} clients.")
        notes.append(f"{n} clients need {n} distinct prompts and {', '.join(categories)} "
                     f"{'has' if len(categories) == 1 else 'have'} {len(items)}: added "
                     f"{', '.join(c + '/' + item['id'] for c, item in borrowed)} from the other categories")
        items += borrowed
    return items[:n], notes


def render_prompts(pipe, prompt_set: dict, categories: list[str]) -> tuple[list[Prompt], str]:
    """Every prompt in the target's chat template when it has one (else the raw text), for every engine."""
    template = pipe.chat_template
    prompts = []
    for category in categories:
        for item in prompt_set[category]:
            messages = [{"role": "user", "content": item["text"]}]
            if template is not None:
                prompts.append(Prompt(item["id"], category, messages, template.render(messages),
                                      pipe.chat_prompt(messages)))
            else:
                prompts.append(Prompt(item["id"], category, messages, item["text"], item["text"]))
    return prompts, ("the target's chat template" if template is not None
                     else "raw text: the target has no chat template")
