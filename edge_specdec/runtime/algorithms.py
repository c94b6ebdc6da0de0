"""The algorithm registry: every decoding algorithm, what it needs, its defaults and how its drafter is built, and
the rule `auto` follows, in one table.

The Pipeline, `auto`, the CLI's choices and its `algorithms:` help, docs/usage.md's table, `check` and the
benchmark's default rows all read REGISTRY; a new algorithm is one entry here plus its drafter. A drafter reports
its own statistics (`stats()`), which land in `Result.extra`.
"""
from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from typing import Callable, Optional, Union

import numpy as np

from ..errors import EdgeSpecdecError
from ..vocab_map import VocabMap
from .draft_window import ChatHead, window_of
from .drafters import DraftModelDrafter, Drafter, PromptLookupDrafter
from .grammar import GrammarTokenizer
from .heterogeneous import DraftTextContext, SLEMDrafter, TLIDrafter, draft_prompt_ids
from .retokenize import Retokenizer
from .sampling import GenerationConfig
from .session import ModelSession, common_prefix
from .slrs import SLRSDrafter
from .suffix import FREE_TOKENS, DraftPool, SuffixDrafter
from .text import decode

ANY_RELATION = ("identical", "heterogeneous", "target-only")
# auto picks TLI for sampling when at least this share of the draft's vocabulary exists in the target's
TLI_MIN_DRAFT_SHARE = 0.5
# a draft model drafts up to DRAFT_TOKENS per round and stops after a token whose probability (its top one) is
# under CONFIDENCE (benchmarks/RESULTS.md compares these defaults with the others measured)
DRAFT_TOKENS, CONFIDENCE = 8, 0.7
LOOKUP_TOKENS = 3  # prompt lookup has no probabilities: a fixed length
# a draft model's rounds first try a free copy of text the target has seen (sources.FreeFirst): text that repeats
# (code being edited, an answer quoting its document, a revised answer, a tool-call loop) goes by in long runs
LOOKUP_FIRST = True


@dataclass(frozen=True)
class DraftContext:
    """What a drafter is built from: the draft model's session, the engine's shared parts a drafter reads, and one
    generate() call's prompt and settings."""
    draft: Optional[ModelSession]             # the draft model's session (None: the bundle has no draft)
    target_width: int                         # the target's number of logits
    vocab_map: VocabMap
    target_retokenizer: Retokenizer
    draft_retokenizer: Callable[[], Retokenizer]  # the draft's, compiled when a drafter first asks for it
    draft_eos: Optional[int]                  # the draft's end-of-sequence token
    prompt: Union[str, list[int]]
    prompt_ids: list[int]
    config: GenerationConfig
    rng: np.random.Generator
    confidence: float
    # the draft's vocabulary for structured output's grammar engine, built when a constrained run of a drafter
    # that drafts in the draft's vocabulary first asks (None: such a drafter drafts freely under a constraint)
    draft_grammar_tokenizer: Optional[Callable[[], GrammarTokenizer]] = None
    pool: Optional[DraftPool] = None          # the engine's draft pool, where this request may read it
    pool_scope: str = ""                      # the part of the pool it reads
    # the most tokens the draft model's cache holds: a longer sequence is read through a window of this many
    # (draft_window.py); None: the whole sequence, and a draft whose context it outgrows stops drafting
    draft_window: Optional[int] = None
    # how a sampling draft model draws its tokens instead of the run's random numbers (Drafter.steer; None in runs)
    steer: Optional[Callable[[list[int], list[int], np.ndarray], int]] = None
    # the prompt's chat head, the draft window's head where it fits (draft_window.py); None: the prompt has none
    chat_head: Optional[ChatHead] = None
    # the target's special tokens whose twins (the same name) the draft's vocabulary has: target id -> draft id,
    # read when a drafter of the draft's text first asks (None: none)
    draft_special_twins: Optional[Callable[[], dict[int, int]]] = None

    def free_drafter(self) -> SuffixDrafter:
        """The request's free drafts: its own text and the pool (suffix.py); a copy ends at an end-of-sequence
        token, where the run would stop (unless it ignores them)."""
        ends = () if self.config.ignore_eos else tuple(self.config.eos_token_ids or ())
        return SuffixDrafter(self.prompt_ids, self.pool, self.pool_scope, ends=ends,
                             same_word=self.vocab_map.target.same_word, starts_with=self.vocab_map.target.starts_with,
                             respell=self.target_retokenizer)


@dataclass(frozen=True)
class Algorithm:
    name: str
    draft: str                        # what drafts, for --help and docs/usage.md: a vocabulary, "no model" or ""
    summary: str                      # how it proposes and verifies, one line for --help and docs/usage.md
    # runs a draft model: its rounds can first try a free copy (sources.FreeFirst) and stop when the draft is
    # unsure (confidence)
    needs_draft: bool
    relations: tuple[str, ...]        # the bundle vocabulary relations it serves
    benchmark_for: tuple[str, ...]    # the relations whose benchmark runs it by default
    drafter: Optional[Callable[[DraftContext], Drafter]] = None  # None: the target alone
    draft_tokens: int = 0             # the most tokens a round drafts unless the request says (0: none drafted)
    drafts_ahead: bool = False        # can draft the next round while the target verifies (concurrent mode)

    @property
    def speculates(self) -> bool:
        """Whether anything drafts (False: the target alone, one token per pass)."""
        return self.drafter is not None


def _standard(c: DraftContext) -> Drafter:
    window = window_of(c.draft_window, c.chat_head.tokens if c.chat_head else None)  # the draft's tokens: the target's
    drafter = DraftModelDrafter(c.draft, c.config, c.rng, c.confidence, width=c.target_width,
                                prompt_length=len(c.prompt_ids), window=window)
    drafter.steer = c.steer
    return drafter


def _text_context(c: DraftContext) -> DraftTextContext:
    """The draft's view of the prompt, in its own tokens: the prompt as text, re-tokenized by the draft, with the
    target's special tokens that have twins in the draft's vocabulary as those (heterogeneous.draft_prompt_ids)."""
    retokenizer = c.draft_retokenizer()
    twins = c.draft_special_twins() if c.draft_special_twins is not None else {}
    with_twins = any(token in twins for token in c.prompt_ids)

    def read(prompt_ids: list[int], text: str) -> list[int]:  # some of the prompt's first tokens, and their text
        if with_twins:
            return draft_prompt_ids(prompt_ids, c.vocab_map.target, retokenizer, twins)
        return retokenizer.encode(text)
    ids = read(c.prompt_ids, c.prompt if isinstance(c.prompt, str) else decode(c.vocab_map.target, c.prompt_ids))
    # the chat head in the draft's tokens: as far as the draft spells its text as it spells the whole prompt's
    head = (common_prefix(read(c.prompt_ids[:c.chat_head.tokens], c.chat_head.text), ids)
            if c.chat_head and c.draft_window else None)
    return DraftTextContext(c.draft, retokenizer, c.vocab_map, len(c.prompt_ids), ids,
                            grammar_tokenizer=c.draft_grammar_tokenizer, window=window_of(c.draft_window, head))


def _text_drafter(kind) -> Callable[[DraftContext], Drafter]:
    def build(c: DraftContext) -> Drafter:
        return kind(_text_context(c), c.target_retokenizer, c.vocab_map, c.config, c.rng, c.draft_eos, c.confidence)
    return build


def _tli(c: DraftContext) -> Drafter:
    drafter = TLIDrafter(_text_context(c), c.vocab_map, c.config, c.rng, c.confidence)
    drafter.steer = c.steer
    return drafter


def _draft_model(name: str, draft: str, summary: str, relations: tuple[str, ...], benchmark_for: tuple[str, ...],
                 drafter: Callable[[DraftContext], Drafter]) -> Algorithm:
    """An algorithm with a draft model: it drafts up to DRAFT_TOKENS per round, also while the target verifies."""
    return Algorithm(name, draft, summary, True, relations, benchmark_for, drafter, draft_tokens=DRAFT_TOKENS,
                     drafts_ahead=True)


REGISTRY: dict[str, Algorithm] = {a.name: a for a in [
    Algorithm("none", "", "the target alone, one token per pass", False, ANY_RELATION, ()),
    _draft_model("standard", "same vocabulary", "greedy match, or rejection sampling with the draft's q",
                 ("identical",), ("identical",), _standard),
    # no model drafts, so there is nothing to draft while the target verifies
    Algorithm("prompt-lookup", "no model", "n-gram matches from the prompt and the output", False, ANY_RELATION,
              (), lambda c: PromptLookupDrafter(), draft_tokens=LOOKUP_TOKENS),
    Algorithm("suffix", "no model", "copies the most frequent continuation of the longest match in the request "
              "and in earlier requests (the draft pool)", False, ANY_RELATION, ANY_RELATION,
              lambda c: c.free_drafter(), draft_tokens=FREE_TOKENS),
    _draft_model("slem", "any vocabulary", "the draft's text is re-tokenized for the target, which keeps the longest "
                 "prefix it would have written itself", ("identical", "heterogeneous"), ("heterogeneous",),
                 _text_drafter(SLEMDrafter)),
    _draft_model("tli", "any vocabulary", "the draft drafts only tokens both vocabularies share; rejection sampling",
                 ("identical", "heterogeneous"), ("heterogeneous",), _tli),
    _draft_model("slrs", "any vocabulary", "string-level rejection sampling; practical only with a small top-k "
                 "(it enumerates the draft's token tree); greedy SLRS is SLEM", ("identical", "heterogeneous"), (),
                 _text_drafter(SLRSDrafter)),
]}
AUTO = "auto"  # the registry's choice for the bundle and the request (see auto_algorithm)
ALGORITHMS = (AUTO, *REGISTRY)  # what a caller may ask for
AUTO_SUMMARY = (f"standard for identical vocabularies; else slem when greedy, tli when sampling if at least "
                f"{TLI_MIN_DRAFT_SHARE:.0%} of the draft's vocabulary is shared (else slem); suffix without "
                f"a draft; a draft model's rounds first try a free copy (suffix's)")


def auto_algorithm(relation: str, greedy: bool, draft_share: float) -> str:
    """What `auto` runs for a bundle with this vocabulary relation (and share of the draft's vocabulary that exists
    in the target's), greedy or sampling: see AUTO_SUMMARY."""
    if relation == "identical":
        return "standard"
    if relation == "target-only":
        return "suffix"
    return "slem" if greedy or draft_share < TLI_MIN_DRAFT_SHARE else "tli"


def resolve(algorithm: str, relation: str, has_draft: bool, greedy: bool = True, draft_share: float = 0.0) -> str:
    """The algorithm to run when `algorithm` is asked for: `auto` follows the vocabulary relation and the sampling
    mode; a name must serve the bundle (EdgeSpecdecError says what to use instead)."""
    if algorithm not in ALGORITHMS:
        raise EdgeSpecdecError(f"unknown algorithm {algorithm!r}: choose one of {', '.join(ALGORITHMS)}.")
    if algorithm == AUTO:
        return auto_algorithm(relation, greedy, draft_share)
    entry = REGISTRY[algorithm]
    if entry.needs_draft and not has_draft:
        raise EdgeSpecdecError(f"algorithm {algorithm!r} needs a draft model, but this bundle has only a "
                               f"target. Use suffix, prompt-lookup or none, or export the bundle with --draft.")
    if relation not in entry.relations:
        serving = ", ".join(name for name, a in REGISTRY.items() if relation in a.relations)
        raise EdgeSpecdecError(f"algorithm {algorithm!r} needs a draft with the target's vocabulary, but this "
                               f"bundle's relation is {relation!r}. Use {serving} or auto.")
    return algorithm


def available(relation: str, has_draft: bool) -> list[str]:
    """The algorithms a bundle can run (besides auto): those that serve its vocabulary relation, and need no draft
    model if it has none; the target alone first."""
    return [name for name, a in REGISTRY.items() if relation in a.relations and (has_draft or not a.needs_draft)]


def benchmark_algorithms(relation: str) -> list[str]:
    """The algorithms a benchmark of a bundle with this vocabulary relation runs by default, those with a draft
    model first."""
    chosen = [a for a in REGISTRY.values() if relation in a.benchmark_for and a.speculates]
    return [a.name for a in sorted(chosen, key=lambda a: not a.needs_draft)]


def algorithms_help(width: int = 110) -> str:
    """The `algorithms:` section of `edge-specdec run --help`: one entry per algorithm, `auto` first."""
    lines = ["algorithms:"]
    rows = [(AUTO, f"the default: {AUTO_SUMMARY}")]
    rows += [(a.name, f"{a.draft}: {a.summary}" if a.draft else a.summary) for a in REGISTRY.values()]
    for name, text in rows:
        lines += textwrap.wrap(text, width, initial_indent=f"  {name:<15}", subsequent_indent=" " * 17)
    return "\n".join(lines) + "\n"


def markdown_table() -> str:
    """docs/usage.md's table of algorithms (`--algorithm`, what drafts, how it works)."""
    names = "|".join(re.escape(name) for name in sorted(REGISTRY, key=len, reverse=True))
    auto = re.sub(rf"(?<![\w-])({names})(?![\w-])", r"`\1`", AUTO_SUMMARY)  # the names in backticks
    rows = ["| `--algorithm` | draft | how it works |", "|---|---|---|"]
    rows += [f"| `{a.name}` | {a.draft or '-'} | {a.summary} |" for a in REGISTRY.values()]
    rows.append(f"| `{AUTO}` (default) | | {auto} |")
    return "\n".join(rows) + "\n"
