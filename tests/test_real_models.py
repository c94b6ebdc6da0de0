"""Opt-in end-to-end export on the real models of ../shared/real-models (get-real-models.sh).

Run with: EDGE_SPECDEC_REAL_MODELS_TESTS=1 pytest -m real_models -s
The full pairs with timings and memory: python benchmarks/export_real_models.py
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from edge_specdec.bundle import load_bundle
from edge_specdec.export import WeightSettings, export_bundle
from hostile_text import HOSTILE_STRINGS

ROOT = Path(os.environ.get("EDGE_SPECDEC_REAL_MODELS", Path.home() / ".cache/edge-specdec/real-models"))
pytestmark = [
    pytest.mark.real_models,
    pytest.mark.skipif(os.environ.get("EDGE_SPECDEC_REAL_MODELS_TESTS") != "1",
                       reason="opt-in: set EDGE_SPECDEC_REAL_MODELS_TESTS=1"),
    pytest.mark.skipif(not (ROOT / "hf").is_dir(), reason=f"{ROOT}/hf missing: run get-real-models.sh"),
]


def test_real_heterogeneous_pair_with_gguf_draft(tmp_path):
    """Qwen2.5-Coder-0.5B (folder, int8) + SmolLM2-135M straight from its GGUF file (int8)."""
    import openvino as ov
    from transformers import AutoTokenizer

    out = export_bundle(str(ROOT / "hf/qwen2.5-coder-0.5b-instruct"), str(ROOT / "gguf/SmolLM2-135M-Instruct.Q4_1.gguf"),
                        tmp_path / "b", target_weights=WeightSettings("int8"), draft_weights=WeightSettings("int8"),
                        progress=print)
    bundle = load_bundle(out)
    assert bundle.draft.info["source"]["kind"] == "gguf"
    vocab = bundle.vocabulary
    print(vocab)
    assert vocab["relation"] == "heterogeneous" and 35_000 < vocab["intersection"] < 45_000
    core = ov.Core()
    # the reference for each side is the Hugging Face tokenizer read from the same source (the GGUF reader's
    # SmolLM2 tokenizer adds a BOS token where the original folder's does not)
    for entry, hf in ((bundle.target, AutoTokenizer.from_pretrained(ROOT / "hf/qwen2.5-coder-0.5b-instruct")),
                      (bundle.draft, AutoTokenizer.from_pretrained(ROOT / "gguf",
                                                                   gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf"))):
        encode = core.compile_model(entry.tokenizer_xml, "CPU")
        for text in HOSTILE_STRINGS:
            assert encode([text])["input_ids"][0].tolist() == hf(text)["input_ids"], (entry.role, text)
    vmap = bundle.load_vocab_map()
    mapped = np.flatnonzero(vmap.draft_to_target >= 0)
    assert all(vmap.draft.piece(i) == vmap.target.piece(vmap.draft_to_target[i]) for i in mapped[:5000]
               if i != bundle.draft.special_tokens["eos_token_id"])
