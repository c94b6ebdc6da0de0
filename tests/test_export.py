"""Export of tiny pairs: bundle contents, weight formats, logits against PyTorch, tokenizer parity."""
from __future__ import annotations

import json

import numpy as np
import openvino as ov
import pytest

from edge_specdec.bundle import load_bundle
from edge_specdec.export.token_bytes import token_table
from edge_specdec.vocab_map import NO_TOKEN
from hostile_text import HOSTILE_STRINGS

PAIRS = {"heterogeneous": ("qwen2-bytelevel", "llama-metaspace"),
         "same-vocabulary": ("qwen2-bytelevel", "qwen2-bytelevel-small")}
# The element type NNCF stores the weights in, per format, and the least share it must hold. For int4 the
# embedding and output layers stay int8 (NNCF's default), which is most of a tiny model's weights.
MAIN_TYPE = {"int4": ("u4", 0.25), "int8": ("u8", 0.95), "fp16": ("f16", 0.99)}


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["int4", "int8", "fp16"])
@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_export_pair(bundle_dir, model_dir, pair, fmt):
    target, draft = PAIRS[pair]
    bundle = load_bundle(bundle_dir(target, draft, fmt, fmt), verify=True)
    m = bundle.manifest
    for entry, name in ((bundle.target, target), (bundle.draft, draft)):
        weights = entry.info["weights"]
        assert weights["format"] == fmt
        shares = weights["share_by_type"]
        main_type, least = MAIN_TYPE[fmt]
        assert shares.get(main_type, 0) >= least and "f32" not in shares, shares
        assert entry.info["source"] == {"given": str(model_dir(name)), "kind": "local"}
        assert entry.info["inputs"] == ["input_ids", "attention_mask", "position_ids", "beam_idx"]
        for f in ("openvino_model.xml", "openvino_tokenizer.xml", "openvino_detokenizer.xml", "tokenizer.json"):
            assert (entry.folder / f).is_file()
    if fmt == "int4":
        assert bundle.target.info["weights"]["group_size"] == 128  # the default; adjusted per layer by NNCF
    relation = m["vocabulary"]["relation"]
    assert relation == ("identical" if pair == "same-vocabulary" else "heterogeneous")
    # every file is listed with its checksum, and nothing else lies in the bundle
    on_disk = {p.relative_to(bundle.path).as_posix() for p in bundle.path.rglob("*") if p.is_file()}
    assert on_disk - {"manifest.json"} == set(m["files"])
    assert m["tool_versions"]["openvino"] and m["tool_versions"]["edge-specdec"]


def test_special_tokens_recorded(bundle_dir, model_dir):
    bundle = load_bundle(bundle_dir(*PAIRS["heterogeneous"], "int4", "int8"))
    from transformers import AutoTokenizer
    for entry, name in ((bundle.target, PAIRS["heterogeneous"][0]), (bundle.draft, PAIRS["heterogeneous"][1])):
        hf = AutoTokenizer.from_pretrained(model_dir(name))
        special = entry.special_tokens
        assert special["eos_token"] == hf.eos_token and special["eos_token_id"] == hf.eos_token_id
        assert special["bos_token_id"] == hf.bos_token_id
        assert hf.eos_token_id in special["eos_token_ids"]


def test_overlap_figures_match_recount(bundle_dir, model_dir):
    bundle = load_bundle(bundle_dir(*PAIRS["heterogeneous"], "int4", "int8"))
    vocab = bundle.vocabulary
    t = token_table(model_dir(PAIRS["heterogeneous"][0]))
    d = token_table(model_dir(PAIRS["heterogeneous"][1]))
    t_strings = {p for p in t.pieces if p}
    d_strings = {p for p in d.pieces if p}
    d_shared = sum(1 for p in d.pieces if p and p in t_strings)
    t_shared = sum(1 for p in t.pieces if p and p in d_strings)
    assert vocab["intersection"] == d_shared > 0
    assert vocab["draft_share"] == round(d_shared / sum(1 for p in d.pieces if p), 4)
    assert vocab["target_share"] == round(t_shared / sum(1 for p in t.pieces if p), 4)
    vmap = bundle.load_vocab_map()
    eos_t, eos_d = bundle.target.special_tokens["eos_token_id"], bundle.draft.special_tokens["eos_token_id"]
    assert vmap.draft_to_target[eos_d] == eos_t and vmap.target_to_draft[eos_t] == eos_d
    for i in np.flatnonzero(vmap.draft_to_target != NO_TOKEN):
        if i != eos_d:
            assert vmap.draft.piece(i) == vmap.target.piece(vmap.draft_to_target[i])


def stateful_logits(model_xml, ids: list[int]) -> np.ndarray:
    """Logits of the exported stateful model over a whole prompt in one pass."""
    # full precision everywhere: the CPU plugin otherwise stores the KV cache in u8 and may quantize activations
    compiled = ov.Core().compile_model(model_xml, "CPU", {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32",
                                                          "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"})
    request = compiled.create_infer_request()
    request.reset_state()
    n = len(ids)
    out = request.infer({"input_ids": np.array([ids], dtype=np.int64),
                         "attention_mask": np.ones((1, n), dtype=np.int64),
                         "position_ids": np.arange(n, dtype=np.int64)[None],
                         "beam_idx": np.zeros(1, dtype=np.int32)})
    return out["logits"][0].astype(np.float64)


@pytest.mark.slow
@pytest.mark.parametrize("fmt,tolerance", [("fp32", 1e-4), ("fp16", 2e-2)])
def test_exported_logits_match_pytorch(bundle_dir, model_dir, fmt, tolerance):
    """The IR computes what the PyTorch model computes: max |difference| <= tolerance * max |logit| (+ tolerance)."""
    import torch
    from transformers import AutoModelForCausalLM

    target = "qwen2-bytelevel"
    bundle = load_bundle(bundle_dir(target, None, fmt, fmt))
    model = AutoModelForCausalLM.from_pretrained(model_dir(target)).eval()
    rng = np.random.default_rng(0)
    for length in (1, 7, 40):
        ids = rng.integers(0, model.config.vocab_size, size=length).tolist()
        with torch.no_grad():
            ref = model(torch.tensor([ids])).logits[0].double().numpy()
        got = stateful_logits(bundle.target.model_xml, ids)
        assert got.shape == ref.shape
        assert np.abs(got - ref).max() <= tolerance * (1 + np.abs(ref).max()), (length, np.abs(got - ref).max())
        assert (got.argmax(-1) == ref.argmax(-1)).mean() >= 0.9


@pytest.mark.slow
@pytest.mark.parametrize("draft", ["llama-metaspace", "gpt2-prefixspace", "qwen2-bytelevel-small"])
def test_converted_tokenizers_match_hugging_face(bundle_dir, model_dir, draft):
    """The bundle's OpenVINO tokenizer gives the Hugging Face ids, and its detokenizer gives the HF text."""
    from transformers import AutoTokenizer

    bundle = load_bundle(bundle_dir("qwen2-bytelevel", draft, "int8", "int8"))
    core = ov.Core()
    for entry, name in ((bundle.target, "qwen2-bytelevel"), (bundle.draft, draft)):
        hf = AutoTokenizer.from_pretrained(model_dir(name))
        encode = core.compile_model(entry.tokenizer_xml, "CPU")
        decode = core.compile_model(entry.detokenizer_xml, "CPU")
        for text in HOSTILE_STRINGS:
            if text == "<0x41> looks like a byte token" and name == "llama-metaspace":
                continue  # a known openvino-tokenizers difference: see test_literal_byte_token_text below
            ref = hf(text)["input_ids"]
            got = encode([text])["input_ids"][0].tolist()
            assert got == ref, (name, text)
            if ref:
                assert decode(np.array([ref], dtype=np.int64))["string_output"][0] == \
                    hf.decode(ref, skip_special_tokens=True), (name, text)


@pytest.mark.xfail(strict=True, reason="openvino-tokenizers 2026.4 reads literal '<0xNN>' text as a byte-fallback "
                                       "token; Hugging Face spells it with ordinary tokens. Fails loudly once fixed.")
def test_literal_byte_token_text(bundle_dir, model_dir):
    from transformers import AutoTokenizer

    bundle = load_bundle(bundle_dir("qwen2-bytelevel", "llama-metaspace", "int8", "int8"))
    hf = AutoTokenizer.from_pretrained(model_dir("llama-metaspace"))
    encode = ov.Core().compile_model(bundle.draft.tokenizer_xml, "CPU")
    text = "<0x41> looks like a byte token"
    assert encode([text])["input_ids"][0].tolist() == hf(text)["input_ids"]


@pytest.mark.slow
def test_target_only_bundle(bundle_dir):
    bundle = load_bundle(bundle_dir("qwen2-bytelevel", None, "fp32", "fp32"))
    assert bundle.draft is None
    assert bundle.vocabulary["relation"] == "target-only"
    assert not any(rel.startswith("draft/") for rel in bundle.manifest["files"])
    assert json.loads((bundle.path / "manifest.json").read_text())["draft"] is None


@pytest.mark.slow
def test_data_aware_int4_with_calibration_text(model_dir, tmp_path):
    """AWQ and scale estimation on a calibration text file run, and the manifest records them."""
    from edge_specdec.export import WeightSettings, export_bundle

    calib = tmp_path / "calib.txt"
    calib.write_text("def add(a, b):\n    return a + b\nprint('hello world')\nclass A:\n    pass\n")
    settings = WeightSettings("int4", group_size=32, awq=True, scale_estimation=True, dataset=str(calib))
    bundle = load_bundle(export_bundle(str(model_dir("qwen2-bytelevel")), None, tmp_path / "b",
                                       target_weights=settings))
    weights = bundle.target.info["weights"]
    assert weights["awq"] and weights["scale_estimation"] and weights["dataset"] == str(calib)
    assert weights["group_size"] == 32 and weights["share_by_type"]["u4"] >= 0.25


@pytest.mark.slow  # exports a bundle
def test_export_records_generation_defaults_only_when_told(model_dir, tmp_path, capsys):
    """--generation-default goes into the manifest, which `info` shows and a request's unset fields take; a
    setting that does not exist or a value GenerationConfig refuses stops the export before anything is written."""
    from edge_specdec.bundle import load_bundle
    from edge_specdec.cli import main
    from edge_specdec.runtime.pipeline import bundle_defaults

    target = str(model_dir("qwen2-bytelevel"))
    for bad, words in (("repetiton_penalty=1.3", "no such setting"), ("top_p=0", "top_p must be in (0, 1]"),
                       ("temperature", "write NAME=VALUE")):
        assert main(["export", "--target", target, "--out", str(tmp_path / "bad"),
                     "--generation-default", bad]) == 1
        assert words in capsys.readouterr().err and not any(tmp_path.iterdir())
    assert main(["export", "--target", target, "--out", str(tmp_path / "b"), "--quiet",
                 "--generation-default", "repetition_penalty=1.3", "--generation-default", "top_k=5"]) == 0
    bundle = load_bundle(tmp_path / "b", verify=False)
    assert bundle.generation_defaults == {"repetition_penalty": 1.3, "top_k": 5}
    assert (bundle_defaults(bundle).repetition_penalty, bundle_defaults(bundle).top_k) == (1.3, 5)
    capsys.readouterr()
    assert main(["info", str(tmp_path / "b"), "--no-verify"]) == 0
    assert "defaults repetition_penalty 1.3, top_k 5 (recorded at export" in capsys.readouterr().out
    assert main(["export", "--target", target, "--out", str(tmp_path / "plain"), "--quiet"]) == 0
    assert "generation_defaults" not in load_bundle(tmp_path / "plain", verify=False).manifest
