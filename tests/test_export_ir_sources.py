"""OpenVINO IR folders as export sources: the tiny fixtures exported by optimum-cli (in the test itself), then bundled
without converting their weights and without torch; the bundle's outputs against the one exported from the Hugging
Face folders; folders that are not stateful LLMs refused in one line before anything is written."""
from __future__ import annotations

import filecmp
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import openvino as ov
import pytest

from edge_specdec.bundle import load_bundle
from edge_specdec.cli import main
from edge_specdec.export.sources import count_parameters
from support import tree_state

TARGET, DRAFT = "qwen2-bytelevel", "llama-metaspace"
# Both routes compress with NNCF's int8_asym, one scale per output channel (optimum-cli's --weight-format int8 and
# export's int8 settings), so their weights are the same bytes (asserted below) and int8 bundles must agree exactly;
# were the two quantizations ever to differ, the comparison would have to move to fp32, where both are the same.
FORMAT = "int8"
PROMPTS = ["def parse_args(argv):\n", "class Stack:\n    def push(self, item):", "import json\n\n\ndef load(path):"]
HEAVY = ("torch", "transformers", "optimum", "nncf")


@pytest.fixture(scope="session")
def ir_dir(workdir, model_dir):
    """ir_dir(name) -> the tiny model exported by optimum-cli to a stateful int8 IR (tokenizers converted too),
    once per session."""
    cache: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in cache:
            out = workdir / f"ir-{name}"
            done = subprocess.run(["optimum-cli", "export", "openvino", "--model", str(model_dir(name)), "--task",
                                   "text-generation-with-past", "--weight-format", FORMAT, str(out)],
                                  capture_output=True, text=True)
            assert done.returncode == 0, done.stderr[-2000:]
            cache[name] = out
        return cache[name]
    return get


# The IR-only export in a process of its own: a hook on import statements records every attempt to import torch,
# transformers, optimum or nncf (even one that something would catch), and sys.modules is read at the end.
_EXPORT_WITHOUT_TORCH = """
import builtins, json, sys

attempts = []
plain_import = builtins.__import__

def recording_import(name, *args, **kwargs):
    if name.split(".")[0] in {heavy!r}:
        attempts.append(name)
    return plain_import(name, *args, **kwargs)

builtins.__import__ = recording_import
from edge_specdec.export import export_bundle
export_bundle(sys.argv[1], sys.argv[2], sys.argv[3], progress=lambda m: print(m, file=sys.stderr))
print(json.dumps({{"attempts": sorted(set(attempts)),
                  "imported": [m for m in {heavy!r} if sys.modules.get(m) is not None]}}))
"""


@pytest.fixture(scope="session")
def ir_pair(workdir, ir_dir):
    """The IR pair's bundle, exported in a child process, with what that process imported. The draft's folder
    holds no converted tokenizer (tokenizer.json only), so both tokenizer routes run: the target's IRs taken as they
    are, the draft's tokenizer.json converted by openvino-tokenizers."""
    draft = workdir / "ir-draft-tokenizer-json-only"
    shutil.copytree(ir_dir(DRAFT), draft)
    for name in ("openvino_tokenizer.xml", "openvino_tokenizer.bin", "openvino_detokenizer.xml",
                 "openvino_detokenizer.bin"):
        (draft / name).unlink()
    out = workdir / "bundles" / "ir-pair"
    done = subprocess.run([sys.executable, "-c", _EXPORT_WITHOUT_TORCH.format(heavy=HEAVY), str(ir_dir(TARGET)),
                           str(draft), str(out)], capture_output=True, text=True, env=dict(os.environ))
    assert done.returncode == 0, done.stderr[-3000:]
    return out, json.loads(done.stdout.strip().splitlines()[-1]), draft


def greedy_ids(bundle: Path, algorithm: str = "auto") -> list[list[int]]:
    from edge_specdec.runtime import GenerationConfig, Pipeline

    pipe = Pipeline(bundle, target_device="CPU", draft_device="CPU")
    # a strong repetition penalty keeps the tiny random models from repeating one token: varied, still greedy
    config = GenerationConfig(max_new_tokens=24, repetition_penalty=5.0, ignore_eos=True)
    return [pipe.generate(prompt, config, algorithm=algorithm).token_ids for prompt in PROMPTS]


@pytest.mark.slow
def test_ir_pair_exported_without_torch(ir_pair):
    _, imports, _ = ir_pair
    assert imports == {"attempts": [], "imported": []}


# The export extra's packages made unimportable, as on a device with the runtime alone (pip install edge-specdec).
_EXPORT_WITH_THE_RUNTIME_ALONE = """
import sys
for name in ("torch", "transformers", "optimum", "nncf", "tokenizers", "huggingface_hub", "gguf", "accelerate"):
    sys.modules[name] = None
from edge_specdec.cli import main
sys.exit(main(["export", "--target", sys.argv[1], "--draft", sys.argv[2], "--out", sys.argv[3]]))
"""


@pytest.mark.slow
def test_ir_pair_exports_with_the_runtime_install_alone(ir_dir, tmp_path):
    """IR folders with converted tokenizers need nothing of the export extra: their tokenizer IRs are checked against
    tokenizer.json with the standard library and OpenVINO alone, and taken as they are."""
    out = tmp_path / "bundle"
    done = subprocess.run([sys.executable, "-c", _EXPORT_WITH_THE_RUNTIME_ALONE, str(ir_dir(TARGET)),
                           str(ir_dir(DRAFT)), str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    bundle = load_bundle(out, verify=True)
    for entry, name in ((bundle.target, TARGET), (bundle.draft, DRAFT)):
        assert entry.info["source_kind"] == "openvino-ir"
        assert filecmp.cmp(ir_dir(name) / "openvino_tokenizer.bin", entry.folder / "openvino_tokenizer.bin",
                           shallow=False)


@pytest.mark.slow
def test_ir_bundle_records_and_copies_the_weights(ir_pair, ir_dir, model_dir, bundle_dir):
    out, _, draft_source = ir_pair
    bundle = load_bundle(out, verify=True)  # every file present with its checksum
    hf = load_bundle(bundle_dir(TARGET, DRAFT, FORMAT, FORMAT))
    on_disk = {p.relative_to(bundle.path).as_posix() for p in bundle.path.rglob("*") if p.is_file()}
    assert on_disk - {"manifest.json"} == set(bundle.manifest["files"])
    assert not list(out.parent.glob(f".{out.name}.*"))  # no partial or scratch folder left beside it
    for entry, source, name in ((bundle.target, ir_dir(TARGET), TARGET), (bundle.draft, draft_source, DRAFT)):
        info = entry.info
        assert info["source_kind"] == "openvino-ir"
        assert info["source"] == {"given": str(source), "kind": "local"}
        weights = info["weights"]
        assert weights["format"] == "int8" and weights["mode"] == "int8_asym" and weights["sym"] is False
        assert weights["share_by_type"]["u8"] > 0.95
        assert info["inputs"] == ["input_ids", "attention_mask", "position_ids", "beam_idx"]
        # the weights are the IR's own bytes: not converted, not recompressed
        assert filecmp.cmp(source / "openvino_model.bin", entry.folder / "openvino_model.bin", shallow=False)
        assert abs(info["num_parameters"] - count_parameters(model_dir(name))) <= 0.02 * info["num_parameters"]
        hf_info = getattr(hf, entry.role).info
        for key in ("architecture", "model_type", "logits_size", "tokenizer_size", "tokenizer_style",
                    "special_tokens", "max_position_embeddings"):
            assert info[key] == hf_info[key], key
    # the target's tokenizer IRs are optimum-cli's, the draft's were converted from its tokenizer.json
    assert filecmp.cmp(ir_dir(TARGET) / "openvino_tokenizer.bin", bundle.target.folder / "openvino_tokenizer.bin",
                       shallow=False)
    assert (bundle.draft.folder / "openvino_detokenizer.xml").is_file()
    # the vocabulary map and its summary are the Hugging Face route's
    assert bundle.vocabulary == hf.vocabulary
    ours, theirs = np.load(bundle.vocab_map_path), np.load(hf.vocab_map_path)
    assert sorted(ours.files) == sorted(theirs.files)
    for key in ours.files:
        assert np.array_equal(ours[key], theirs[key]), key


@pytest.mark.slow
def test_ir_bundle_outputs_equal_the_hugging_face_bundle(ir_pair, bundle_dir):
    hf = bundle_dir(TARGET, DRAFT, FORMAT, FORMAT)
    # the same weights either way (see FORMAT), so the outputs below must be the same token ids
    for role in ("target", "draft"):
        assert filecmp.cmp(hf / role / "openvino_model.bin", ir_pair[0] / role / "openvino_model.bin", shallow=False)
    ours = greedy_ids(ir_pair[0])
    assert ours == greedy_ids(hf)
    assert ours == greedy_ids(ir_pair[0], algorithm="none")  # and the draft's rounds are lossless
    assert any(len(set(ids)) > 3 for ids in ours)  # outputs varied enough for the comparison to mean something
    # both sides' tokenizers (the target's from optimum-cli, the draft's converted from its tokenizer.json) encode
    # as the Hugging Face bundle's do
    from edge_specdec.runtime.text import PromptTokenizer
    for role in ("target", "draft"):
        from_ir = PromptTokenizer(ir_pair[0] / role / "openvino_tokenizer.xml")
        from_hf = PromptTokenizer(hf / role / "openvino_tokenizer.xml")
        for prompt in PROMPTS + ["  two  spaces\tand\ttabs", "emoji \U0001F600 and \u4e2d\u6587"]:
            assert from_ir.encode(prompt) == from_hf.encode(prompt), (role, prompt)


@pytest.mark.slow
@pytest.mark.parametrize("ir_role", ["target", "draft"])
def test_mixed_sources(ir_role, ir_dir, model_dir, bundle_dir, workdir):
    """An IR target with a Hugging Face draft, and the reverse: the converted side gets export's weights, the IR side
    keeps its own, and the bundle decodes as the one built from both Hugging Face folders."""
    from edge_specdec.export import WeightSettings, export_bundle

    sources = {"target": str(model_dir(TARGET)), "draft": str(model_dir(DRAFT))}
    sources[ir_role] = str(ir_dir(TARGET if ir_role == "target" else DRAFT))
    other = "draft" if ir_role == "target" else "target"
    out = export_bundle(sources["target"], sources["draft"], workdir / "bundles" / f"mixed-ir-{ir_role}",
                        **{f"{other}_weights": WeightSettings(FORMAT)})
    bundle = load_bundle(out, verify=True)
    assert getattr(bundle, ir_role).info["source_kind"] == "openvino-ir"
    assert getattr(bundle, other).info["source_kind"] == "huggingface"
    assert getattr(bundle, other).info["weights"]["format"] == FORMAT
    assert greedy_ids(out) == greedy_ids(bundle_dir(TARGET, DRAFT, FORMAT, FORMAT))


def _stateless_model(folder: Path) -> None:
    """A model with a stateless LLM's interface (the KV cache as inputs), as `optimum-cli ... --disable-stateful`
    writes one: inputs input_ids, attention_mask, position_ids, past_key_values.0.key/value; output logits."""
    import openvino.opset13 as ops

    ids = ops.parameter([1, -1], ov.Type.i64, name="input_ids")
    mask = ops.parameter([1, -1], ov.Type.i64, name="attention_mask")
    positions = ops.parameter([1, -1], ov.Type.i64, name="position_ids")
    past = [ops.parameter([1, 2, -1, 8], ov.Type.f32, name=f"past_key_values.0.{kind}") for kind in ("key", "value")]
    table = ops.constant(np.zeros((700, 16), dtype=np.float32))
    logits = ops.gather(table, ops.add(ids, ops.multiply(mask, positions)), ops.constant(0))
    logits.output(0).set_names({"logits"})
    model = ov.Model([logits], [ids, mask, positions, *past], "stateless")
    ov.save_model(model, folder / "openvino_model.xml")


def _not_an_llm(kind: str, folder: Path, tokenizer_json: Path) -> str:
    """Make a folder that is not a stateful LLM; return the words its refusal must contain."""
    folder.mkdir()
    shutil.copyfile(tokenizer_json, folder / "tokenizer.json")
    if kind == "stateless":
        _stateless_model(folder)
        return "not a stateful LLM"
    if kind == "random-xml":
        (folder / "openvino_model.xml").write_text("<net><layers><layer id='0'/></layers></net>\n")
        (folder / "openvino_model.bin").write_bytes(os.urandom(64))
        return "not a model OpenVINO can read"
    if kind == "no-bin":
        _stateless_model(folder)
        (folder / "openvino_model.bin").unlink()
        return "without its weights openvino_model.bin"
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["stateless", "random-xml", "no-bin"])
def test_not_a_stateful_llm_refused_in_one_line(kind, tmp_path, model_dir, capsys):
    words = _not_an_llm(kind, tmp_path / "model", model_dir(TARGET) / "tokenizer.json")
    out = tmp_path / "out" / "bundle"
    before = tree_state(tmp_path)
    capsys.readouterr()  # what building the fixtures printed
    code = main(["export", "--target", str(tmp_path / "model"), "--out", str(out), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"edge-specdec: error: --target {tmp_path / 'model'}: ") and words in err, err
    assert "optimum-cli export openvino" in err  # the fix
    assert tree_state(tmp_path) == before and not (tmp_path / "out").exists()  # nothing, not even --out's parent


@pytest.mark.slow
def test_ir_without_tokenizer_json_or_state_inputs_refused(ir_dir, tmp_path, capsys):
    """An optimum-cli folder without tokenizer.json, and one whose model lacks an input the runtime feeds."""
    no_tokenizer = tmp_path / "no-tokenizer"
    shutil.copytree(ir_dir(TARGET), no_tokenizer)
    (no_tokenizer / "tokenizer.json").unlink()
    no_positions = tmp_path / "no-positions"
    shutil.copytree(ir_dir(TARGET), no_positions, ignore=shutil.ignore_patterns("openvino_model.*"))
    # read from the source folder, saved into the copy: saving over the .bin that read_model maps is a bus error
    model = ov.Core().read_model(ir_dir(TARGET) / "openvino_model.xml")
    # position_ids renamed: still stateful, but one input is not the runtime's (as a model that takes cache_position)
    model.input("position_ids").get_tensor().set_names({"cache_position"})
    ov.save_model(model, no_positions / "openvino_model.xml", compress_to_fp16=False)
    for folder, words in ((no_tokenizer, "no tokenizer.json"),
                          (no_positions, "lacks the inputs position_ids; has inputs the runtime does not feed "
                                         "(cache_position)")):
        before = tree_state(tmp_path)
        capsys.readouterr()  # what building the fixtures printed
        code = main(["export", "--target", str(folder), "--out", str(tmp_path / "out"), "--quiet"])
        err = capsys.readouterr().err.strip()
        assert code == 1 and len(err.splitlines()) == 1 and words in err, err
        assert tree_state(tmp_path) == before


@pytest.mark.slow
def test_ir_with_another_models_tokenizer_or_without_config_refused(ir_dir, model_dir, tmp_path, capsys):
    """A 700-token tokenizer.json beside a model of 600 logits, and a folder without config.json: each refused in one
    line naming what is wrong, before anything is written."""
    foreign = tmp_path / "foreign-tokenizer"
    shutil.copytree(ir_dir(DRAFT), foreign)
    shutil.copyfile(model_dir(TARGET) / "tokenizer.json", foreign / "tokenizer.json")
    no_config = tmp_path / "no-config"
    shutil.copytree(ir_dir(TARGET), no_config)
    (no_config / "config.json").unlink()
    for folder, words in ((foreign, "its tokenizer.json has 700 tokens but the model has 600 logits"),
                          (no_config, "no config.json beside the model")):
        before = tree_state(tmp_path)
        capsys.readouterr()  # what building the fixtures printed
        code = main(["export", "--target", str(folder), "--out", str(tmp_path / "out"), "--quiet"])
        err = capsys.readouterr().err.strip()
        assert code == 1 and len(err.splitlines()) == 1 and words in err, err
        assert tree_state(tmp_path) == before


@pytest.mark.slow
def test_weight_options_for_an_ir_must_match_its_weights(ir_dir, tmp_path, capsys):
    out = tmp_path / "out"
    ir_dir(TARGET)
    capsys.readouterr()  # what building the fixtures printed
    code = main(["export", "--target", str(ir_dir(TARGET)), "--target-weights", "int4", "--out", str(out), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1 and "int8 weights go into the bundle as they are" in err, err
    assert not out.exists()
    # the format it has is accepted (nothing to convert), and --check-only says what it would do
    code = main(["export", "--target", str(ir_dir(TARGET)), "--target-weights", "int8", "--out", str(out),
                 "--check-only", "--quiet"])
    printed = capsys.readouterr().out
    assert code == 0 and "weights int8 kept as they are (an OpenVINO IR)" in printed, printed
    assert not out.exists()


def _hub_cache(cache: Path, repo_id: str, folder: Path, revision: str) -> None:
    """Put folder's files into a Hugging Face hub cache as huggingface_hub lays out a download: each file's bytes in
    blobs/, the revision's tree of links to them in snapshots/REVISION/, and refs/main naming the revision."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)
    for file in folder.iterdir():
        blob = repo / "blobs" / hashlib.sha256(file.read_bytes()).hexdigest()
        blob.parent.mkdir(exist_ok=True)
        shutil.copyfile(file, blob)
        link = repo / "snapshots" / revision / file.name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))


# The export extra's packages made unimportable but huggingface_hub, as after pip install 'edge-specdec[hub]'.
_EXPORT_WITH_THE_HUB_EXTRA = """
import sys
for name in ("torch", "transformers", "optimum", "nncf", "tokenizers", "gguf", "accelerate"):
    sys.modules[name] = None
from edge_specdec.cli import main
sys.exit(main(["export", "--target", sys.argv[1], "--draft", sys.argv[2], "--out", sys.argv[3], "--quiet"]))
"""


def _hub_env(home: Path) -> dict[str, str]:
    """An offline hub whose cache is home/hub."""
    return {**os.environ, "HF_HOME": str(home), "HF_HUB_CACHE": str(home / "hub"), "HF_HUB_OFFLINE": "1"}


@pytest.mark.slow
def test_hub_ids_of_ir_repositories_from_the_hub_cache_without_torch(ir_dir, tmp_path):
    """Hub ids of OpenVINO IR repositories, read by huggingface_hub from its cache (offline, as after a download),
    with the runtime and the hub extra alone: the bundle holds the repositories' files, and a local folder of the
    same name as a hub id is taken as it is."""
    home = tmp_path / "hf"
    _hub_cache(home / "hub", "OpenVINO/tiny-target-int8-ov", ir_dir(TARGET), "0123abc")
    _hub_cache(home / "hub", "OpenVINO/tiny-draft-int8-ov", ir_dir(DRAFT), "4567def")
    out = tmp_path / "from-hub"
    done = subprocess.run([sys.executable, "-c", _EXPORT_WITH_THE_HUB_EXTRA, "OpenVINO/tiny-target-int8-ov",
                           "OpenVINO/tiny-draft-int8-ov", str(out)], capture_output=True, text=True,
                          env=_hub_env(home))
    assert done.returncode == 0, done.stderr[-2000:]
    bundle = load_bundle(out, verify=True)
    for entry, name, repo_id in ((bundle.target, TARGET, "OpenVINO/tiny-target-int8-ov"),
                                 (bundle.draft, DRAFT, "OpenVINO/tiny-draft-int8-ov")):
        assert entry.info["source"] == {"given": repo_id, "kind": "hub"}
        assert entry.info["source_kind"] == "openvino-ir" and entry.info["weights"]["format"] == "int8"
        assert filecmp.cmp(ir_dir(name) / "openvino_model.bin", entry.folder / "openvino_model.bin", shallow=False)

    local = tmp_path / "OpenVINO" / "tiny-target-int8-ov"
    shutil.copytree(ir_dir(TARGET), local)
    done = subprocess.run([sys.executable, "-c", _EXPORT_WITH_THE_HUB_EXTRA, "OpenVINO/tiny-target-int8-ov",
                           "OpenVINO/tiny-draft-int8-ov", str(tmp_path / "from-folder")], capture_output=True,
                          text=True, env=_hub_env(home), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert load_bundle(tmp_path / "from-folder").target.info["source"] == {"given": "OpenVINO/tiny-target-int8-ov",
                                                                           "kind": "local"}


def test_a_hub_id_without_huggingface_hub_names_the_hub_extra(tmp_path):
    """Without huggingface_hub, a hub id is refused in one line that names the extra that brings it, before
    anything is written."""
    script = _EXPORT_WITH_THE_RUNTIME_ALONE.replace('"--out", sys.argv[3]]', '"--out", sys.argv[3], "--quiet"]')
    done = subprocess.run([sys.executable, "-c", script, "OpenVINO/tiny-target-int8-ov", "OpenVINO/tiny-draft-int8-ov",
                           str(tmp_path / "out")], capture_output=True, text=True, env=_hub_env(tmp_path / "hf"))
    err = done.stderr.strip()
    assert done.returncode == 1 and len(err.splitlines()) == 1, err
    assert "--target OpenVINO/tiny-target-int8-ov" in err and "huggingface_hub" in err, err
    assert "pip install 'edge-specdec[hub]'" in err, err
    assert list(tmp_path.iterdir()) == []


def test_the_hub_extra_brings_huggingface_hub_alone():
    import tomllib

    extras = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert [re.split(r"[<>=!~ \[]", requirement)[0] for requirement in extras["hub"]] == ["huggingface-hub"]


@pytest.mark.slow
def test_converted_tokenizer_that_disagrees_is_replaced(ir_dir, bundle_dir, tmp_path):
    """An IR folder whose tokenizer IRs are another model's (here the draft's, another vocabulary: their ids spell
    garbage in the folder's tokenizer.json): the export says so and converts the folder's tokenizer.json instead, so
    the bundle tokenizes as the model was trained."""
    from edge_specdec.export import export_bundle
    from edge_specdec.runtime.text import PromptTokenizer

    folder = tmp_path / "wrong-tokenizer"
    shutil.copytree(ir_dir(TARGET), folder)
    for name in ("openvino_tokenizer.xml", "openvino_tokenizer.bin", "openvino_detokenizer.xml",
                 "openvino_detokenizer.bin"):
        shutil.copyfile(ir_dir(DRAFT) / name, folder / name)
    said = []
    out = export_bundle(str(folder), None, tmp_path / "bundle", progress=said.append)
    assert any("are not used" in line and "converting its tokenizer.json" in line for line in said), said
    ours = PromptTokenizer(out / "target" / "openvino_tokenizer.xml")
    theirs = PromptTokenizer(bundle_dir(TARGET, DRAFT, FORMAT, FORMAT) / "target" / "openvino_tokenizer.xml")
    for prompt in PROMPTS:
        assert ours.encode(prompt) == theirs.encode(prompt)
