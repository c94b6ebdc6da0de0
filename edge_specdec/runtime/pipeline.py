"""The Python API: load a bundle once, generate many times.

    from edge_specdec.runtime import Pipeline, GenerationConfig
    pipe = Pipeline("bundles/qwen")
    result = pipe.generate("def fib(n):", GenerationConfig(max_new_tokens=64), algorithm="standard")
    print(result.text, result.stats.tokens_per_s)

A Pipeline holds one KV cache per model, so it is not thread-safe: use one Pipeline per thread.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Optional, Union

import numpy as np
import openvino as ov

from ..bundle import Bundle, load_bundle
from ..errors import EdgeSpecdecError
from .drafters import DraftLength, DraftModelDrafter, PromptLookupDrafter
from .generate import Result, generate
from .sampling import GenerationConfig
from .session import ModelSession
from .text import PromptTokenizer, TextStream

ALGORITHMS = ("auto", "none", "standard", "prompt-lookup")


class Pipeline:
    def __init__(self, bundle: Union[str, Path, Bundle], target_device: str = "CPU", draft_device: str = "CPU",
                 verify: bool = False):
        self.bundle = bundle if isinstance(bundle, Bundle) else load_bundle(bundle, verify=verify)
        core = ov.Core()
        target = self.bundle.target
        self.target = ModelSession(target.model_xml, target_device, core=core,
                                   max_context=target.info.get("max_position_embeddings"))
        draft = self.bundle.draft
        self.draft = ModelSession(draft.model_xml, draft_device, core=core,
                                  max_context=draft.info.get("max_position_embeddings")) if draft else None
        self.tokenizer = PromptTokenizer(target.tokenizer_xml, core)
        self.vocab_map = self.bundle.load_vocab_map()

    def resolve_algorithm(self, algorithm: str) -> str:
        if algorithm not in ALGORITHMS:
            raise EdgeSpecdecError(f"unknown algorithm {algorithm!r}: choose one of {', '.join(ALGORITHMS)}.")
        relation = self.bundle.vocabulary["relation"]
        if algorithm == "auto":
            return "standard" if relation == "identical" else "prompt-lookup"
        if algorithm == "standard" and relation != "identical":
            raise EdgeSpecdecError(f"algorithm 'standard' needs a draft with the target's vocabulary, but this "
                                   f"bundle's relation is {relation!r}. Use prompt-lookup or none.")
        return algorithm

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
        name = self.resolve_algorithm(algorithm)
        rng = np.random.default_rng(config.seed)
        drafter = None
        if name == "standard":
            drafter = DraftModelDrafter(self.draft, config, rng, confidence)
        elif name == "prompt-lookup":
            drafter = PromptLookupDrafter()
        result = generate(self.target, prompt_ids, config, TextStream(self.vocab_map.target), drafter,
                          DraftLength(num_assistant_tokens, adaptive), rng, on_text)
        result.extra["algorithm"] = name
        return result
