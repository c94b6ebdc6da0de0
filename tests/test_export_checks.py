"""Export checks before it converts: architectures against the installed optimum-intel / transformers, and
tokenizers against openvino-tokenizers, all before the first (slow) model conversion.

The "installed" versions are faked through edge_specdec.export.checks.installed_version, the one place the checks
read them from; the conversion functions are replaced by recorders to prove they were never reached.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

import edge_specdec.export as export_pkg
from edge_specdec.bundle import load_bundle
from edge_specdec.cli import main
from edge_specdec.errors import ExportError
from edge_specdec.export import check_export, checks, export_bundle, sources
from edge_specdec.export.convert import PARITY_STRINGS, WeightSettings

sys.path.insert(0, str(Path(__file__).parent.parent / "models"))
from tiny_pair import build_model  # noqa: E402

GEMMA3_FIX = 'pip install "transformers==4.57.6"'


# ---------------------------------------------------------------------------------------------------------------
# tiny sources built here


@pytest.fixture(scope="module")
def gemma3_dir(tmp_path_factory, tokenizer_dir):
    """A tiny random Gemma 3 text model (model_type gemma3_text, Gemma3ForCausalLM), as Gemma-3-270M is."""
    import torch
    from transformers import AutoTokenizer, Gemma3ForCausalLM, Gemma3TextConfig

    out = tmp_path_factory.mktemp("gemma3")
    tok = AutoTokenizer.from_pretrained(tokenizer_dir("bytelevel"))
    cfg = Gemma3TextConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
                           bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                           pad_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    Gemma3ForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    assert json.loads((out / "config.json").read_text())["model_type"] == "gemma3_text"
    return out


def renamed_model(src: Path, dest: Path, model_type: str, architecture: str) -> Path:
    """A copy of a tiny model folder whose config.json claims another architecture."""
    shutil.copytree(src, dest)
    config = json.loads((dest / "config.json").read_text())
    config["model_type"], config["architectures"] = model_type, [architecture]
    (dest / "config.json").write_text(json.dumps(config))
    return dest


def gguf_header_only(path: Path, architecture: str, name: str = "tiny") -> Path:
    """A .gguf file with only a header (no tensors): enough for the early architecture check."""
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name(name)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def fake_versions(monkeypatch):
    """fake_versions(transformers="5.5.4"): what the checks believe is installed (others stay real)."""
    real = checks.installed_version

    def use(**versions):
        monkeypatch.setattr(checks, "installed_version",
                            lambda dist: versions.get(dist.replace("-", "_"), real(dist)))
    return use


@pytest.fixture
def no_conversion(monkeypatch):
    """Replace every step that converts or resolves a source by a recorder; returns the list of calls."""
    calls = []

    def recorder(name):
        def record(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"{name} was called: the checks should have stopped the export before it")
        return record
    monkeypatch.setattr(export_pkg, "export_model", recorder("export_model"))
    monkeypatch.setattr(export_pkg, "export_tokenizer", recorder("export_tokenizer"))
    monkeypatch.setattr(export_pkg, "resolve_source", recorder("resolve_source"))
    monkeypatch.setattr(sources, "_from_gguf", recorder("_from_gguf"))
    return calls


# ---------------------------------------------------------------------------------------------------------------
# architecture / version checks


def test_gemma3_draft_with_transformers_5_5_fails_before_any_conversion(model_dir, gemma3_dir, tmp_path,
                                                                         fake_versions, no_conversion):
    fake_versions(transformers="5.5.4")
    out = tmp_path / "bundles" / "qwen-gemma"
    with pytest.raises(ExportError) as err:
        export_bundle(str(model_dir("qwen2-bytelevel")), str(gemma3_dir), out)
    message = str(err.value)
    assert no_conversion == []
    assert not out.exists() and not out.parent.exists()  # nothing written at all, not even the parent folder
    assert GEMMA3_FIX in message
    assert f"--draft {gemma3_dir}" in message and "gemma3_text (Gemma3ForCausalLM)" in message
    assert "transformers 5.5.4" in message and f"optimum-intel {checks.installed_version('optimum-intel')}" in message
    assert "<= 5.0" in message
    assert "--target" not in message  # the good target is not blamed


def test_gemma3_passes_with_the_release_the_fix_names(gemma3_dir, fake_versions):
    fake_versions(transformers="4.57.6")
    assert checks.check_architecture(checks.folder_architecture(gemma3_dir), "draft", str(gemma3_dir)) is None
    fake_versions(transformers="5.0.0")  # optimum-intel's bound itself: "> 5.0" is refused, 5.0.0 is not
    assert checks.check_architecture(checks.folder_architecture(gemma3_dir), "draft", str(gemma3_dir)) is None
    fake_versions(transformers="5.0.1")
    assert checks.check_architecture(checks.folder_architecture(gemma3_dir), "draft", str(gemma3_dir)) is not None


def test_fix_for_each_kind_of_range(monkeypatch, fake_versions):
    """The pip command follows the range optimum-intel states, within optimum-intel's own transformers requirement;
    no command when no transformers release can work."""
    from packaging.specifiers import SpecifierSet

    fake_versions(optimum_intel="2.2.0")
    monkeypatch.setattr(checks, "_optimum_intel_transformers_spec", lambda: SpecifierSet("<5.6,>=4.51"))
    assert checks._version_fix("gemma3_text", "4.57", "5.0")[0] == GEMMA3_FIX       # the tested pin
    assert checks._version_fix("lfm2", "4.57", "5.4.0")[0] == 'pip install "transformers==5.4.0"'
    assert checks._version_fix("gemma3n_text", "5.0", "5.0")[0] == 'pip install "transformers==5.0.0"'
    assert checks._version_fix("qwen3_5_text", "5.2.0", "5.2.99")[0] == 'pip install "transformers==5.2.*"'
    assert checks._version_fix("qwen2", "4.57", None)[0] == 'pip install "transformers>=4.57"'
    fix, notes = checks._version_fix("gemma4_text", "5.5", "5.0")                     # MIN above MAX
    assert fix is None and "another optimum-intel release" in notes[0]
    fix, notes = checks._version_fix("muse_glimmer_text", "5.15.0", None)              # beyond optimum-intel's <5.6
    assert fix is None and "another optimum-intel release" in notes[0]


def test_too_old_transformers_for_qwen2(model_dir, tmp_path, fake_versions, no_conversion):
    """A minimum version (optimum-intel's OpenVINOConfig.MIN_TRANSFORMERS_VERSION) is checked the same way."""
    fake_versions(transformers="4.46.0")
    target = model_dir("qwen2-bytelevel")
    with pytest.raises(ExportError) as err:
        check_export(str(target), None, tmp_path / "b")
    assert 'pip install "transformers>=4.57"' in str(err.value)
    assert f"--target {target}: qwen2 (Qwen2ForCausalLM)" in str(err.value)
    assert no_conversion == [] and not (tmp_path / "b").exists()


def test_our_verdict_agrees_with_optimum_intel(gemma3_dir, tmp_path):
    """With the really installed versions, optimum-intel itself refuses gemma3 exactly when our check does."""
    from optimum.exporters.openvino import main_export
    from optimum.intel import OVConfig

    problem = checks.check_architecture(checks.folder_architecture(gemma3_dir), "draft", str(gemma3_dir))
    try:
        main_export(str(gemma3_dir), tmp_path / "ov", task=checks.TASK, ov_config=OVConfig(dtype="fp32"),
                    stateful=True, convert_tokenizer=False)
        refused = False
    except ValueError as exc:
        assert "does not allow for the export" in str(exc), exc
        refused = True
    assert refused == (problem is not None), problem and problem.message()


@pytest.mark.parametrize("model_type,architecture,expected", [
    ("bert", "BertForMaskedLM", "only for the tasks"),         # known to optimum-intel, not as a text decoder
    ("tiny_custom_lm", "TinyCustomForCausalLM", "not an architecture that optimum-intel"),
])
def test_unsupported_architecture_fails_before_any_conversion(model_dir, tmp_path, no_conversion, model_type,
                                                              architecture, expected):
    draft = renamed_model(model_dir("qwen2-bytelevel-small"), tmp_path / "draft", model_type, architecture)
    out = tmp_path / "bundles" / "b"
    with pytest.raises(ExportError) as err:
        export_bundle(str(model_dir("qwen2-bytelevel")), str(draft), out)
    assert expected in str(err.value) and f"--draft {draft}: {model_type} ({architecture})" in str(err.value)
    assert no_conversion == []
    assert not out.parent.exists()


def test_both_bad_sources_are_reported_together(model_dir, gemma3_dir, tmp_path, fake_versions, no_conversion):
    fake_versions(transformers="5.5.4")
    target = renamed_model(model_dir("qwen2-bytelevel"), tmp_path / "target", "tiny_custom_lm", "TinyForCausalLM")
    with pytest.raises(ExportError) as err:
        export_bundle(str(target), str(gemma3_dir), tmp_path / "bundles" / "b")
    assert f"--target {target}" in str(err.value) and f"--draft {gemma3_dir}" in str(err.value)
    assert GEMMA3_FIX in str(err.value)
    assert no_conversion == [] and not (tmp_path / "bundles").exists()


def test_gguf_draft_is_checked_from_its_header_before_dequantizing(model_dir, tmp_path, fake_versions,
                                                                   no_conversion):
    fake_versions(transformers="5.5.4")
    gguf_file = gguf_header_only(tmp_path / "gemma-3-270m.gguf", "gemma3")
    with pytest.raises(ExportError) as err:
        export_bundle(str(model_dir("qwen2-bytelevel")), str(gguf_file), tmp_path / "bundles" / "b")
    assert "gemma3_text" in str(err.value) and "general.architecture = gemma3" in str(err.value)
    assert GEMMA3_FIX in str(err.value)
    assert no_conversion == []  # _from_gguf (the dequantization) never ran
    assert not (tmp_path / "bundles").exists()


def test_gguf_architecture_names_map_as_transformers_maps_them():
    assert checks.gguf_model_type("gemma3") == "gemma3_text"
    assert checks.gguf_model_type("qwen2moe") == "qwen2_moe"
    assert checks.gguf_model_type("llama", "Mistral 7B Instruct") == "mistral"
    assert checks.gguf_model_type("qwen2") == "qwen2"


# ---------------------------------------------------------------------------------------------------------------
# tokenizer checks before the model conversion


@pytest.fixture(scope="module")
def metaspace_split_dir(tmp_path_factory):
    """A tiny Llama whose tokenizer has a Metaspace pre-tokenizer with split=True (openvino-tokenizers splits runs
    of spaces differently from Hugging Face there)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from tiny_pair import _corpus_text

    root = tmp_path_factory.mktemp("metaspace-split")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tok.train_from_iterator(_corpus_text(100_000), trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False))
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                            eos_token="</s>").save_pretrained(root / "tok")
    return build_model("llama", root / "tok", root / "model", seed=7, hidden=32)


def test_bad_draft_tokenizer_fails_before_any_model_conversion(model_dir, metaspace_split_dir, tmp_path,
                                                               monkeypatch):
    models = []
    monkeypatch.setattr(export_pkg, "export_model", lambda *a, **k: models.append(a) or pytest.fail("converted"))
    out = tmp_path / "bundles" / "b"
    with pytest.raises(ExportError) as err:
        export_bundle(str(model_dir("qwen2-bytelevel")), str(metaspace_split_dir), out)
    message = str(err.value)
    assert f"converted from {metaspace_split_dir} disagrees with its Hugging Face tokenizer" in message
    assert "Metaspace pre-tokenizer has split=True" in message
    assert models == []
    assert not out.exists() and list(out.parent.iterdir()) == []  # the partial bundle was removed


def test_good_pair_checks_convert_nothing_and_write_nothing(model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(export_pkg, "export_model", lambda *a, **k: pytest.fail("check_export converted a model"))
    out = tmp_path / "bundles" / "b"
    summary = check_export(str(model_dir("qwen2-bytelevel")), str(model_dir("llama-metaspace")), out)
    assert summary["target"]["model_type"] == "qwen2" and summary["draft"]["model_type"] == "llama"
    assert summary["draft"]["architectures"] == ["LlamaForCausalLM"]
    assert str(len(PARITY_STRINGS)) in summary["draft"]["tokenizer"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_good_pair_exports_with_tokenizers_checked_first(model_dir, tmp_path, monkeypatch):
    order = []
    real_model, real_tokenizer = export_pkg.export_model, export_pkg.export_tokenizer

    def model(source, *args, **kwargs):
        order.append(("model", Path(source).name))
        return real_model(source, *args, **kwargs)

    def tokenizer(source, *args, **kwargs):
        order.append(("tokenizer", Path(source).name))
        return real_tokenizer(source, *args, **kwargs)
    monkeypatch.setattr(export_pkg, "export_model", model)
    monkeypatch.setattr(export_pkg, "export_tokenizer", tokenizer)
    out = export_bundle(str(model_dir("qwen2-bytelevel")), str(model_dir("llama-metaspace")), tmp_path / "b",
                        target_weights=WeightSettings("fp16"), draft_weights=WeightSettings("fp16"))
    t, d = model_dir("qwen2-bytelevel").name, model_dir("llama-metaspace").name
    assert order == [("tokenizer", t), ("tokenizer", d), ("model", t), ("model", d)]
    bundle = load_bundle(out, verify=True)
    for entry in (bundle.target, bundle.draft):
        assert entry.tokenizer_xml.is_file() and entry.model_xml.is_file()
    assert bundle.draft.info["architecture"] == "LlamaForCausalLM"


# ---------------------------------------------------------------------------------------------------------------
# the command line


def test_cli_check_only(model_dir, gemma3_dir, tmp_path, fake_versions, capsys):
    out = tmp_path / "bundles" / "b"
    target, good = str(model_dir("qwen2-bytelevel")), str(model_dir("llama-metaspace"))
    assert main(["export", "--target", target, "--draft", good, "--out", str(out), "--check-only", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "target:" in printed and "draft:" in printed and printed.count(": ok") == 2
    fake_versions(transformers="5.5.4")
    assert main(["export", "--target", target, "--draft", str(gemma3_dir), "--out", str(out), "--check-only"]) == 1
    assert GEMMA3_FIX in capsys.readouterr().err
    assert not (tmp_path / "bundles").exists()
