"""`pipe.generate([...])` over several prompts: one Result per prompt, each the one that prompt gets alone, generated
at once on sessions of the one engine (their target calls batched on a batching engine)."""
from __future__ import annotations

import numpy as np
import pytest

from edge_specdec.errors import EdgeSpecdecError
from edge_specdec.runtime import GenerationConfig, Pipeline
from support import SAME_VOCAB

PROMPTS = ["def fib(n):", "import os\n", "class Tree:", "x = ", "for i in range(", "print("]


def bits(result) -> list:
    return [(lp.token, np.float64(lp.logprob).view(np.int64)) for lp in result.logprobs]


def test_each_prompt_gets_its_own_result_and_their_calls_are_batched(bundle_dir):
    pipe = Pipeline(bundle_dir(*SAME_VOCAB), batching=True)
    assert pipe.scheduler is not None, pipe.batching_note
    config = GenerationConfig(max_new_tokens=64, ignore_eos=True, logprobs=True)
    prompts = PROMPTS + [pipe.tokenizer.encode("while True:")]  # token ids are a prompt too
    alone = [pipe.generate(prompt, config, algorithm="standard") for prompt in prompts]
    before = pipe.scheduler.stats()["batched_calls"]
    results = pipe.generate(prompts, config, algorithm="standard")
    assert len(results) == len(prompts)
    for prompt, want, got in zip(prompts, alone, results):
        assert got.token_ids == want.token_ids and got.text == want.text, prompt
        assert bits(got) == bits(want)
    assert pipe.scheduler.stats()["batched_calls"] > before  # the prompts' calls ran together


def test_several_prompts_without_batching_and_sampled(bundle_dir):
    pipe = Pipeline(bundle_dir(*SAME_VOCAB))
    config = GenerationConfig(max_new_tokens=16, temperature=0.8, top_k=20, seed=3, ignore_eos=True)
    prompts = PROMPTS * 2  # more prompts than sessions at once: sessions take the next prompt when done
    results = pipe.generate(prompts, config)
    assert [r.token_ids for r in results] == [pipe.generate(p, config).token_ids for p in prompts]
    one = pipe.generate([PROMPTS[0]], config)
    assert isinstance(one, list) and one[0].token_ids == results[0].token_ids
    assert not isinstance(pipe.generate([5, 6, 7], GenerationConfig(max_new_tokens=2)), list)  # one id prompt


def test_several_prompts_refuse_a_text_or_prefill_callback_and_raise_a_prompts_error(bundle_dir):
    pipe = Pipeline(bundle_dir(*SAME_VOCAB))
    with pytest.raises(EdgeSpecdecError, match="on_text streams the text of one prompt"):
        pipe.generate(PROMPTS[:2], on_text=print)
    with pytest.raises(EdgeSpecdecError, match="on_prefill reports the prefill of one prompt"):
        pipe.generate(PROMPTS[:2], on_prefill=print)
    with pytest.raises(EdgeSpecdecError, match="the prompt is empty"):
        pipe.generate(["x", ""], GenerationConfig(max_new_tokens=2))
