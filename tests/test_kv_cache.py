"""The KV cache's element type: f16 by default on the CPU (half of f32's bytes, as exact), f32 on request, u8 as an
explicit choice that is not block-invariant, so that runs on it say they are exact only up to float noise."""
from __future__ import annotations

import pytest

from edge_specdec.errors import EdgeSpecdecError
from edge_specdec.runtime import GenerationConfig, Pipeline
from edge_specdec.runtime.settings import EngineConfig
from edge_specdec.runtime.session import open_model
from support import SAME_VOCAB, load_target_xml


def test_the_cpu_default_is_f16_and_takes_half_the_bytes_of_f32(bundle_dir):
    xml = load_target_xml(bundle_dir)
    f16, f32 = open_model(xml), open_model(xml, kv_cache="f32")
    assert f16.kv_cache == "f16" and f32.kv_cache == "f32"
    assert f16.block_invariant and f32.block_invariant and not f16.exactness_note
    assert f16.kv_bytes_per_token * 2 == f32.kv_bytes_per_token > 0


# GPT-2's config names in the slow tier: the only test of the fast tier's that would export its bundle
@pytest.mark.parametrize("pair", [SAME_VOCAB, pytest.param(("gpt2-prefixspace-large", None), marks=pytest.mark.slow)])
def test_info_gives_the_kv_bytes_the_compiled_model_has(bundle_dir, pair):
    """info reads the KV bytes per token from config.json (no compile); the compiled cache's block shapes must
    agree, for Qwen's config names and for GPT-2's."""
    from edge_specdec.bundle import describe, load_bundle

    bundle = load_bundle(bundle_dir(*pair))
    compiled = open_model(bundle.target.model_xml).kv_bytes_per_token
    line = next(line for line in describe(bundle).splitlines() if "KV cache" in line)
    assert f"KV cache {compiled / 1024:.1f} KiB per token at f16" in line, (line, compiled)


def test_a_u8_cache_is_not_exact_and_says_why(bundle_dir):
    model = open_model(load_target_xml(bundle_dir), kv_cache="u8")
    assert model.kv_cache == "u8" and not model.block_invariant
    assert "u8 KV cache is not block-invariant" in model.exactness_note
    assert model.kv_bytes_per_token < open_model(load_target_xml(bundle_dir)).kv_bytes_per_token


def test_unknown_cache_types_are_refused(bundle_dir):
    with pytest.raises(EdgeSpecdecError, match="kv_cache"):
        EngineConfig(kv_cache="bf16")
    with pytest.raises(EdgeSpecdecError, match="unknown KV cache type"):
        open_model(load_target_xml(bundle_dir), kv_cache="int4")


@pytest.mark.parametrize("kv_cache, exact", [(None, True), ("f32", True), ("u8", False)])
def test_runs_report_exactness_by_cache(bundle_dir, kv_cache, exact):
    pipe = Pipeline(bundle_dir(*SAME_VOCAB), cache_dir="off", kv_cache=kv_cache)
    config = GenerationConfig(max_new_tokens=24, temperature=0, logprobs=True, ignore_eos=True)
    alone = pipe.generate("def f(x):", config, algorithm="none")
    run = pipe.generate("def f(x):", config, algorithm="standard")
    assert run.exact is exact
    if exact:
        assert run.token_ids == alone.token_ids
        assert [lp.logprob for lp in run.logprobs] == [lp.logprob for lp in alone.logprobs]
