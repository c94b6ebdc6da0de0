"""Every bad input gets an error that names the problem and the fix, and leaves the disk as it was."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from edge_specdec.bundle import MANIFEST_VERSION, load_bundle
from edge_specdec.errors import BundleError, ExportError, SourceError
from edge_specdec.export import WeightSettings, export_bundle
from support import tree_state

TARGET, DRAFT = "qwen2-bytelevel", "qwen2-bytelevel-small"


@pytest.fixture
def bundle_copy(bundle_dir, tmp_path) -> Path:
    """A private copy of a small exported bundle, free to damage."""
    dst = tmp_path / "bundle"
    shutil.copytree(bundle_dir(TARGET, DRAFT, "int8", "int8"), dst)
    return dst


def export_fails(tmp_path: Path, match: str, exc=ExportError, **kwargs):
    """Run an export that must fail; check the message and that tmp_path is unchanged."""
    before = tree_state(tmp_path)
    with pytest.raises(exc, match=match):
        export_bundle(**kwargs)
    assert tree_state(tmp_path) == before, "a failed export changed the disk"


# ---------- sources ----------

def test_missing_source_folder(tmp_path, model_dir):
    export_fails(tmp_path, r"--target .*no such folder or file", SourceError,
                 target=str(tmp_path / "nope"), draft=str(model_dir(DRAFT)), out=tmp_path / "b")


def test_folder_without_config(tmp_path, model_dir):
    empty = tmp_path / "empty-model"
    empty.mkdir()
    export_fails(tmp_path, r"no config\.json", SourceError,
                 target=str(model_dir(TARGET)), draft=str(empty), out=tmp_path / "b")


def test_folder_without_tokenizer_json(tmp_path, model_dir):
    broken = tmp_path / "no-tokenizer"
    shutil.copytree(model_dir(DRAFT), broken)
    (broken / "tokenizer.json").unlink()
    export_fails(tmp_path, r"no tokenizer\.json", SourceError,
                 target=str(model_dir(TARGET)), draft=str(broken), out=tmp_path / "b")


def test_missing_gguf_file(tmp_path, model_dir):
    export_fails(tmp_path, r"no such \.gguf file", SourceError,
                 target=str(tmp_path / "model.gguf"), draft=str(model_dir(DRAFT)), out=tmp_path / "b")


def test_broken_gguf_file(tmp_path, model_dir):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF but not really")
    export_fails(tmp_path, r"could not read this GGUF file", SourceError,
                 target=str(bad), draft=str(model_dir(DRAFT)), out=tmp_path / "b")


def test_hub_id_offline(tmp_path, model_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    export_fails(tmp_path, r"could not download it from the Hugging Face hub.*local path", SourceError,
                 target="no-such-org/no-such-model", draft=str(model_dir(DRAFT)), out=tmp_path / "b")


def test_swapped_target_and_draft(tmp_path, model_dir):
    export_fails(tmp_path, r"did you swap --target and --draft\?.*--allow-larger-draft",
                 target=str(model_dir(DRAFT)), draft=str(model_dir(TARGET)), out=tmp_path / "b")


# ---------- weight settings ----------

@pytest.mark.parametrize("settings,match", [
    (WeightSettings("int3"), r"choose one of int4, int8, fp16, fp32"),
    (WeightSettings("int4", group_size=0), r"group size 0 is invalid"),
    (WeightSettings("int4", ratio=1.5), r"ratio 1\.5 must be in \(0, 1\]"),
    (WeightSettings("int8", awq=True), r"--awq only apply to int4"),
    (WeightSettings("int4", scale_estimation=True), r"scale estimation needs calibration data"),
    (WeightSettings("int4", dataset="/no/such/calibration.txt"), r"is not a file"),
    (WeightSettings("fp16", dataset="wikitext2"), r"only applies to int4/int8"),
    (WeightSettings("int4", group_size_fallback="maybe"), r"choose adjust, ignore or error"),
])
def test_bad_weight_settings(tmp_path, model_dir, settings, match):
    export_fails(tmp_path, match, target=str(model_dir(TARGET)), draft=str(model_dir(DRAFT)), out=tmp_path / "b",
                 target_weights=settings)


# ---------- the output folder ----------

def test_existing_bundle_needs_force(bundle_copy, model_dir):
    before = tree_state(bundle_copy)
    with pytest.raises(ExportError, match=r"already holds a bundle\. Pass --force"):
        export_bundle(str(model_dir(TARGET)), str(model_dir(DRAFT)), bundle_copy)
    assert tree_state(bundle_copy) == before


def test_force_never_replaces_a_foreign_folder(tmp_path, model_dir):
    foreign = tmp_path / "my-documents"
    foreign.mkdir()
    (foreign / "thesis.txt").write_text("precious")
    export_fails(tmp_path, r"not an edge-specdec bundle: refusing to replace it, even with --force",
                 target=str(model_dir(TARGET)), draft=str(model_dir(DRAFT)), out=foreign, force=True)


def test_output_is_a_file(tmp_path, model_dir):
    f = tmp_path / "file"
    f.write_text("x")
    export_fails(tmp_path, r"is an existing file", target=str(model_dir(TARGET)), draft=str(model_dir(DRAFT)), out=f)


@pytest.mark.parametrize("error", [RuntimeError("disk on fire"), KeyboardInterrupt()])
def test_failure_mid_export_leaves_no_half_bundle(bundle_copy, model_dir, monkeypatch, error):
    """A failure (or Ctrl-C) after the target is written: no partial folder, and --force kept the old bundle."""
    import edge_specdec.export as export_mod

    calls = []
    real = export_mod.export_tokenizer

    def fail_on_draft(source, out, name):
        calls.append(out)
        if out.name == "draft":
            raise error
        return real(source, out, name)

    monkeypatch.setattr(export_mod, "export_tokenizer", fail_on_draft)
    parent = bundle_copy.parent
    before = tree_state(parent)
    with pytest.raises(type(error)):
        export_bundle(str(model_dir(TARGET)), str(model_dir(DRAFT)), bundle_copy, force=True)
    assert len(calls) == 2, "the failure should come after the target was written"
    assert tree_state(parent) == before
    load_bundle(bundle_copy)  # the old bundle is intact


# ---------- loading a bundle ----------

def test_load_missing_folder(tmp_path):
    with pytest.raises(BundleError, match=r"does not exist.*edge-specdec export"):
        load_bundle(tmp_path / "nothing")


def test_load_folder_without_manifest(tmp_path):
    with pytest.raises(BundleError, match=r"manifest\.json is missing"):
        load_bundle(tmp_path)


def test_load_invalid_json(bundle_copy):
    (bundle_copy / "manifest.json").write_text("{not json")
    with pytest.raises(BundleError, match=r"not valid JSON.*--force"):
        load_bundle(bundle_copy)


def test_load_missing_file(bundle_copy):
    (bundle_copy / "draft" / "openvino_detokenizer.bin").unlink()
    with pytest.raises(BundleError, match=r"draft/openvino_detokenizer\.bin is missing"):
        load_bundle(bundle_copy)


def test_load_checksum_mismatch(bundle_copy):
    path = bundle_copy / "target" / "openvino_model.bin"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one byte flipped
    path.write_bytes(bytes(data))
    load_bundle(bundle_copy, verify=False)  # sizes alone cannot see it
    with pytest.raises(BundleError, match=r"target/openvino_model\.bin does not match its sha256"):
        load_bundle(bundle_copy)


def test_load_size_mismatch(bundle_copy):
    with open(bundle_copy / "vocab_map.npz", "ab") as f:
        f.write(b"extra")
    with pytest.raises(BundleError, match=r"vocab_map\.npz has \d+ bytes but the manifest says"):
        load_bundle(bundle_copy, verify=False)


@pytest.mark.parametrize("version,match", [(MANIFEST_VERSION + 1, r"upgrade edge-specdec"),
                                           (0, r"re-export"), ("one", r"re-export")])
def test_load_unknown_manifest_version(bundle_copy, version, match):
    mpath = bundle_copy / "manifest.json"
    manifest = json.loads(mpath.read_text())
    manifest["manifest_version"] = version
    mpath.write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match=rf"manifest version .*{match}"):
        load_bundle(bundle_copy)


def test_load_not_our_manifest(bundle_copy):
    (bundle_copy / "manifest.json").write_text(json.dumps({"name": "something else"}))
    with pytest.raises(BundleError, match=r"not an edge-specdec manifest"):
        load_bundle(bundle_copy)


def test_load_swapped_folders(bundle_copy):
    (bundle_copy / "target").rename(bundle_copy / "tmp")
    (bundle_copy / "draft").rename(bundle_copy / "target")
    (bundle_copy / "tmp").rename(bundle_copy / "draft")
    with pytest.raises(BundleError, match=r"target/ and draft/ are swapped"):
        load_bundle(bundle_copy)


def test_tokenizer_that_converts_differently_is_refused(tmp_path, model_dir, monkeypatch):
    """The export checks the OpenVINO tokenizer against Hugging Face's; a disagreement stops it cleanly.
    Literal '<0xNN>' text is a known disagreement for SentencePiece-style tokenizers (see test_export)."""
    import edge_specdec.export.convert as convert

    monkeypatch.setattr(convert, "PARITY_STRINGS", convert.PARITY_STRINGS + ("<0x41> looks like a byte token",))
    export_fails(tmp_path, r"disagrees with its Hugging Face tokenizer on '<0x41> looks like a byte token'",
                 target=str(model_dir(TARGET)), draft=str(model_dir("llama-metaspace")), out=tmp_path / "b")
