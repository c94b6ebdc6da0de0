"""The prompts of an align: those it trains on, and the held-out ones it measures the draft on.

Training prompts: the package's set (edge_specdec/data/align_prompts.jsonl, written by
models/make_align_prompts.py) or the user's --prompts file, in any form read_prompt_file reads. Held-out prompts:
the benchmark's (edge_specdec/benchmark/prompts.json), where speedups are measured; a training prompt with the
text of a held-out one is dropped, so that the measurement is never on text the draft was trained on.

Both are rendered with the target's chat template, as `run --chat` and the benchmark render them, and a fixed share
of the training prompts is set aside as the validation split that decides early stopping.
"""
from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from ...benchmark.prompt_file import read_prompt_file
from ...benchmark.prompt_set import PROMPTS_FILE, render_prompts
from ...errors import ExportError
from ...runtime.text import decode

PACKAGED_PROMPTS = Path(__file__).resolve().parents[2] / "data" / "align_prompts.jsonl"
VALIDATION_EVERY = 10  # every tenth training prompt (in the shuffled order) is in the validation split


@dataclass(frozen=True)
class TrainPrompt:
    id: str
    category: str
    text: str
    split: str  # "train" or "validation"


def prompts_file(path: Union[str, Path, None]) -> Path:
    return Path(path).expanduser() if path else PACKAGED_PROMPTS


def prompts_sha256(path: Union[str, Path, None]) -> str:
    return hashlib.sha256(prompts_file(path).read_bytes()).hexdigest()


def training_prompts(path: Union[str, Path, None], seed: int) -> tuple[list[TrainPrompt], int]:
    """The training prompts in a shuffled, reproducible order with their split, and how many were dropped for
    being held-out prompts. The order spreads the categories, so that a budget that cuts generation short still
    leaves a mix of them."""
    prompt_set = read_prompt_file(prompts_file(path))
    held_out = {item["text"].strip() for items in read_prompt_file(PROMPTS_FILE).values() for item in items}
    items = [(category, item) for category, group in prompt_set.items() for item in group]
    kept = [(c, item) for c, item in items if item["text"].strip() not in held_out]
    if not kept:
        raise ExportError(f"--prompts {path}: every prompt in it is one of the benchmark's held-out prompts, on "
                          "which align measures the draft; give other prompts to train on.")
    random.Random(seed).shuffle(kept)
    prompts = [TrainPrompt(item["id"], category, item["text"],
                           "validation" if i % VALIDATION_EVERY == VALIDATION_EVERY - 1 else "train")
               for i, (category, item) in enumerate(kept)]
    return prompts, len(items) - len(kept)


def render(engine, text: str) -> tuple[str, Union[list[int], str]]:
    """A user message rendered for the target: (the text the draft sees, what Engine.generate takes).

    With a chat template the target gets the template's token ids, and a draft of another vocabulary sees their
    text as the runtime gives it (algorithms._text_context: the target tokens' bytes, so without the special
    tokens' markers); the draft is trained on exactly that text. Without a template both get the text itself."""
    if engine.chat_template is None:
        return text, text
    ids = engine.chat_prompt([{"role": "user", "content": text}])
    return decode(engine.vocab_map.target, ids), ids


def held_out_prompts(engine, count: Optional[int]):
    """The benchmark's prompts rendered for this engine (benchmark.prompt_set.Prompt), all of them or the first
    `count` taken round-robin over the categories."""
    prompt_set = read_prompt_file(PROMPTS_FILE)
    prompts, _ = render_prompts(engine, prompt_set, list(prompt_set))
    if count is None or count >= len(prompts):
        return prompts
    by_category: dict[str, list] = {}
    for p in prompts:
        by_category.setdefault(p.category, []).append(p)
    picked, round_ = [], 0
    while len(picked) < count:
        for group in by_category.values():
            if round_ < len(group) and len(picked) < count:
                picked.append(group[round_])
        round_ += 1
    return picked
