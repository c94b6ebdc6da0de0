"""The Python API: load a bundle once, generate many times.

    from edge_specdec.runtime import Pipeline, GenerationConfig
    pipe = Pipeline("bundles/qwen")
    result = pipe.generate("def fib(n):", GenerationConfig(max_new_tokens=64), algorithm="standard")
    print(result.text, result.stats.tokens_per_s)

A Pipeline holds one KV cache per model, so it is not thread-safe: use one Pipeline per thread.
"""
from __future__ import annotations

import dataclasses
from functools import cached_property
from pathlib import Path
from typing import Callable, Optional, Union

import numpy as np
import openvino as ov

from ..bundle import Bundle, load_bundle
from ..errors import EdgeSpecdecError
from .drafters import Drafter, DraftLength, DraftModelDrafter, PromptLookupDrafter
from .generate import Result, generate
from .heterogeneous import DraftTextContext, SLEMDrafter, TLIDrafter
from .retokenize import Retokenizer
from .sampling import GenerationConfig
from .session import open_session
from .slrs import SLRSDrafter
from .text import PromptTokenizer, TextStream, decode

ALGORITHMS = ("auto", "none", "standard", "prompt-lookup", "slem", "tli", "slrs")
NEEDS_DRAFT = ("standard", "slem", "tli", "slrs")
HETEROGENEOUS = ("slem", "tli", "slrs")
# auto picks TLI for sampling when at least this share of the draft's vocabulary exists in the target's
TLI_MIN_DRAFT_SHARE = 0.5


class Pipeline:
    def __init__(self, bundle: Union[str, Path, Bundle], target_device: str = "CPU", draft_device: str = "CPU",
                 verify: bool = False, precision: str = "dq", kv_rollback: Optional[str] = None):
        self.bundle = bundle if isinstance(bundle, Bundle) else load_bundle(bundle, verify=verify)
        self._core = core = ov.Core()
        target = self.bundle.target
        self.target = open_session(target.model_xml, target_device, core=core, precision=precision,
                                   rollback=kv_rollback, max_context=target.info.get("max_position_embeddings"))
        draft = self.bundle.draft
        self.draft = open_session(draft.model_xml, draft_device, core=core, precision=precision,
                                  rollback=kv_rollback, exact_blocks=False,
                                  max_context=draft.info.get("max_position_embeddings")) if draft else None
        self.tokenizer = PromptTokenizer(target.tokenizer_xml, core)
        self.vocab_map = self.bundle.load_vocab_map()
        self.target_retokenizer = Retokenizer(self.tokenizer.encode, self.vocab_map.target)

    @cached_property
    def draft_retokenizer(self) -> Retokenizer:
        """The draft's tokenizer, compiled when a heterogeneous algorithm first needs it."""
        draft_tokenizer = PromptTokenizer(self.bundle.draft.tokenizer_xml, self._core)
        return Retokenizer(draft_tokenizer.encode, self.vocab_map.draft)

    def resolve_algorithm(self, algorithm: str, config: Optional[GenerationConfig] = None) -> str:
        """The algorithm to run: `auto` follows the vocabulary relation and the sampling mode."""
        if algorithm not in ALGORITHMS:
            raise EdgeSpecdecError(f"unknown algorithm {algorithm!r}: choose one of {', '.join(ALGORITHMS)}.")
        vocabulary = self.bundle.vocabulary
        relation = vocabulary["relation"]
        if algorithm in NEEDS_DRAFT and self.draft is None:
            raise EdgeSpecdecError(f"algorithm {algorithm!r} needs a draft model, but this bundle has only a "
                                   f"target. Use prompt-lookup or none, or export the bundle with --draft.")
        if algorithm == "auto":
            if relation == "identical":
                return "standard"
            if relation == "target-only":
                return "prompt-lookup"
            greedy = config is None or config.greedy
            return "slem" if greedy or vocabulary.get("draft_share", 0) < TLI_MIN_DRAFT_SHARE else "tli"
        if algorithm == "standard" and relation != "identical":
            raise EdgeSpecdecError(f"algorithm 'standard' needs a draft with the target's vocabulary, but this "
                                   f"bundle's relation is {relation!r}. Use slem, tli, slrs or auto.")
        return algorithm

    def _drafter(self, name: str, prompt: Union[str, list[int]], prompt_ids: list[int], config: GenerationConfig,
                 rng: np.random.Generator, confidence: float) -> Optional[Drafter]:
        if name == "standard":
            return DraftModelDrafter(self.draft, config, rng, confidence)
        if name == "prompt-lookup":
            return PromptLookupDrafter()
        if name not in HETEROGENEOUS:
            return None
        text = prompt if isinstance(prompt, str) else decode(self.vocab_map.target, prompt_ids)
        context = DraftTextContext(self.draft, self.draft_retokenizer, self.vocab_map, len(prompt_ids),
                                   self.draft_retokenizer.encode(text))
        if name == "tli":
            return TLIDrafter(context, self.vocab_map, config, rng)
        draft_eos = self.bundle.draft.info["special_tokens"].get("eos_token_id")
        kind = SLEMDrafter if name == "slem" else SLRSDrafter
        return kind(context, self.target_retokenizer, self.vocab_map, config, rng, draft_eos)

    def generate(self, prompt: Union[str, list[int]], config: Optional[GenerationConfig] = None,
                 algorithm: str = "auto", num_assistant_tokens: int = 5, adaptive: bool = False,
                 confidence: float = 0.0, on_text: Optional[Callable[[str], None]] = None) -> Result:
        config = config or GenerationConfig()
        if config.eos_token_ids is None:  # a copy: the caller's config may serve other bundles too
            config = dataclasses.replace(config, eos_token_ids=self.bundle.target.eos_token_ids)
        prompt_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not prompt_ids:
            raise EdgeSpecdecError("the prompt is empty: give some text to continue.")
        if num_assistant_tokens < 1:
            raise EdgeSpecdecError("num_assistant_tokens must be at least 1.")
        name = self.resolve_algorithm(algorithm, config)
        rng = np.random.default_rng(config.seed)
        drafter = self._drafter(name, prompt, prompt_ids, config, rng, confidence)
        result = generate(self.target, prompt_ids, config, TextStream(self.vocab_map.target), drafter,
                          DraftLength(num_assistant_tokens, adaptive), rng, on_text)
        result.extra["algorithm"] = name
        if isinstance(drafter, SLRSDrafter):
            result.extra["slrs_rounds"] = {"exact": drafter.rounds_exact, "slem_fallback": drafter.rounds_fallback}
        return result
