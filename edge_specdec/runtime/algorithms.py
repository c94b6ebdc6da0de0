"""The algorithm registry: every decoding algorithm, what it needs and how its drafter is built, in one table.

`auto`, the CLI's choices, the benchmark's default rows and the Pipeline all read REGISTRY; a new algorithm is
one entry here plus its drafter. A drafter reports its own statistics (`stats()`), which land in
`Result.extra`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional, Union

import numpy as np

from .drafters import DraftModelDrafter, Drafter, PromptLookupDrafter
from .heterogeneous import DraftTextContext, SLEMDrafter, TLIDrafter
from .sampling import GenerationConfig
from .slrs import SLRSDrafter
from .text import decode

if TYPE_CHECKING:
    from .pipeline import DecodingSession

ANY_RELATION = ("identical", "heterogeneous", "target-only")


@dataclass(frozen=True)
class DraftRequest:
    """What a drafter is built from: the decoding session (its engine holds the shared parts) and one generate()
    call's prompt and settings."""
    session: "DecodingSession"
    prompt: Union[str, list[int]]
    prompt_ids: list[int]
    config: GenerationConfig
    rng: np.random.Generator
    confidence: float


@dataclass(frozen=True)
class Algorithm:
    name: str
    summary: str                      # one line for --help and the docs
    needs_draft: bool                 # runs a draft model (and so can take LookupFirst rounds)
    relations: tuple[str, ...]        # the bundle vocabulary relations it serves
    benchmark_for: tuple[str, ...]    # the relations whose benchmark runs it by default
    drafter: Optional[Callable[[DraftRequest], Drafter]] = None  # None: the target alone


def _standard(r: DraftRequest) -> Drafter:
    return DraftModelDrafter(r.session.draft, r.config, r.rng, r.confidence, width=r.session.target.vocab_size)


def _text_context(r: DraftRequest) -> DraftTextContext:
    """The draft's view of the prompt, in its own tokens (the prompt as text, re-tokenized by the draft)."""
    engine = r.session.engine
    text = r.prompt if isinstance(r.prompt, str) else decode(engine.vocab_map.target, r.prompt_ids)
    return DraftTextContext(r.session.draft, engine.draft_retokenizer, engine.vocab_map, len(r.prompt_ids),
                            engine.draft_retokenizer.encode(text))


def _text_drafter(kind) -> Callable[[DraftRequest], Drafter]:
    def build(r: DraftRequest) -> Drafter:
        engine = r.session.engine
        draft_eos = engine.bundle.draft.info["special_tokens"].get("eos_token_id")
        return kind(_text_context(r), engine.target_retokenizer, engine.vocab_map, r.config, r.rng, draft_eos,
                    r.confidence)
    return build


def _tli(r: DraftRequest) -> Drafter:
    return TLIDrafter(_text_context(r), r.session.engine.vocab_map, r.config, r.rng, r.confidence)


REGISTRY: dict[str, Algorithm] = {a.name: a for a in [
    Algorithm("none", "the target alone, one token per pass", False, ANY_RELATION, ()),
    Algorithm("standard", "same vocabulary: greedy match, or rejection sampling with the draft's q", True,
              ("identical",), ("identical",), _standard),
    Algorithm("prompt-lookup", "no draft model: n-gram matches from the prompt and the output", False,
              ANY_RELATION, ANY_RELATION, lambda r: PromptLookupDrafter()),
    Algorithm("slem", "any vocabulary: the draft's text re-tokenized for the target, which keeps the longest "
              "prefix it would have written itself", True, ("identical", "heterogeneous"), ("heterogeneous",),
              _text_drafter(SLEMDrafter)),
    Algorithm("tli", "any vocabulary: the draft drafts only tokens both vocabularies share; rejection sampling",
              True, ("identical", "heterogeneous"), ("heterogeneous",), _tli),
    Algorithm("slrs", "any vocabulary: string-level rejection sampling (needs a small top-k; greedy is SLEM)",
              True, ("identical", "heterogeneous"), (), _text_drafter(SLRSDrafter)),
]}
ALGORITHMS = ("auto", *REGISTRY)  # what a caller may ask for


def benchmark_algorithms(relation: str) -> list[str]:
    """The algorithms a benchmark of a bundle with this vocabulary relation runs by default, those with a draft
    model first."""
    chosen = [a for a in REGISTRY.values() if relation in a.benchmark_for and a.drafter is not None]
    return [a.name for a in sorted(chosen, key=lambda a: not a.needs_draft)]
