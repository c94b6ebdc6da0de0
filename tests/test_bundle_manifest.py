"""A bundle's manifest checked against its schema when the bundle is opened: wrong types, absurd values and paths
that leave the bundle are one-line BundleErrors naming the field, not TypeError or KeyError tracebacks, and not
values used as they are."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from edge_specdec.bundle import load_bundle
from edge_specdec.bundle_manifest import MIN_CONTEXT
from edge_specdec.cli import main
from edge_specdec.demo import DEMO_BUNDLE
from edge_specdec.errors import BundleError


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    path = tmp_path_factory.mktemp("manifest") / "demo"
    shutil.copytree(DEMO_BUNDLE, path)
    return path


@pytest.fixture
def bundle(pristine, tmp_path):
    """A fresh copy of the demo bundle whose manifest a test may damage (files hard-linked: only the manifest is
    rewritten)."""
    path = tmp_path / "demo"

    def link_or_copy(src: str, dst: str) -> None:
        if src.endswith("manifest.json"):
            shutil.copy2(src, dst)
        else:
            os.link(src, dst)
    shutil.copytree(pristine, path, copy_function=link_or_copy)
    return path


def edit(bundle, change) -> None:
    path = bundle / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


def setter(*keys_and_value):
    *keys, value = keys_and_value

    def change(manifest):
        node = manifest
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value
    return change


def first_file(manifest) -> str:
    return next(iter(manifest["files"]))


DAMAGE = [
    (setter("target", "max_position_embeddings", 0),
     f"target.max_position_embeddings (the context) must be at least {MIN_CONTEXT}"),
    *[(setter(role, "max_position_embeddings", n), f"{role}.max_position_embeddings (the context) must be at least "
       f"{MIN_CONTEXT}, not {n}") for role in ("target", "draft") for n in (1, 2, 9, MIN_CONTEXT - 1)],
    (setter("target", "max_position_embeddings", "1024"), "must be an integer, not a string"),
    (setter("target", "logits_size", -5), "target.logits_size must be at least 1"),
    (setter("draft", "logits_size", None), "draft.logits_size must be an integer, not null"),
    (setter("target", "special_tokens", "eos"), "target.special_tokens must be an object"),
    (setter("target", "special_tokens", "eos_token_ids", 0), "eos_token_ids must be a list of token ids"),
    (setter("target", "special_tokens", "eos_token_ids", [-1]), "eos_token_ids[0] must be at least 0"),
    (setter("target", "special_tokens", "eos_token_ids", [10**6]), "eos_token_ids[0] (1000000) is past the model"),
    (setter("draft", "source", None), "draft.source must be an object, not null"),
    (setter("target", "weights", {"format": 4}), "target.weights.format must be a string"),
    (setter("target", "num_parameters", 1.5), "target.num_parameters must be an integer"),
    (setter("vocabulary", "relation", "cousins"), "vocabulary.relation must be one of identical, heterogeneous"),
    (setter("vocabulary", "relation", "target-only"), "'target-only' does not fit a bundle with a draft"),
    (setter("vocabulary", "draft_share", 7), "vocabulary.draft_share must be a number from 0 to 1"),
    (setter("vocabulary", []), "vocabulary must be an object, not a list"),
    (setter("target", []), "target must be an object, not a list"),
    (setter("files", {}), "files lists no files"),
    (lambda m: m["files"].update({"../outside.txt": m["files"][first_file(m)]}), "is not a path inside the bundle"),
    (lambda m: m["files"].update({"/etc/passwd": m["files"][first_file(m)]}), "is not a path inside the bundle"),
    (lambda m: m["files"].update({"target\\..\\..\\x": m["files"][first_file(m)]}), "is not a path inside the bundle"),
    (lambda m: m["files"].__setitem__(first_file(m), {"sha256": "x", "size": 1}), "sha256 must be 64 lowercase hex"),
    (lambda m: m["files"].__setitem__(first_file(m), {**m["files"][first_file(m)], "size": "715"}),
     "size must be an integer"),
    (lambda m: m["files"].__setitem__(first_file(m), None), "must be an object, not null"),
    (lambda m: m.pop("vocabulary"), "'vocabulary' is missing"),
]


@pytest.mark.parametrize("change, words", DAMAGE, ids=[w for _, w in DAMAGE])
def test_a_damaged_manifest_is_one_line_naming_the_field(bundle, change, words):
    edit(bundle, change)
    with pytest.raises(BundleError) as info:
        load_bundle(bundle, verify=False)
    message = str(info.value)
    assert words in message and "\n" not in message and "manifest.json" in message, message


def test_info_says_it_in_one_line(bundle, capsys):
    edit(bundle, setter("target", "max_position_embeddings", 0))
    assert main(["info", str(bundle), "--no-verify"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "max_position_embeddings" in err and "Traceback" not in err


def test_the_packaged_bundle_passes(pristine):
    assert load_bundle(pristine, verify=False).vocabulary["relation"] == "heterogeneous"


@pytest.mark.parametrize("options", [{}, {"static_shapes": True}, {"fixed_blocks": True}],
                         ids=["default", "static", "fixed"])
def test_the_least_context_the_check_takes_is_one_the_engine_loads(bundle_dir, tmp_path, options):
    """MIN_CONTEXT is the engine's real minimum: both models at that context load (the checks and the warm-up
    run, nothing measured before) and answer, with static shapes and fixed blocks too."""
    from edge_specdec.runtime import GenerationConfig, Pipeline
    from support import SAME_VOCAB

    path = tmp_path / "pair"
    shutil.copytree(bundle_dir(*SAME_VOCAB), path)
    edit(path, setter("target", "max_position_embeddings", MIN_CONTEXT))
    edit(path, setter("draft", "max_position_embeddings", MIN_CONTEXT))
    result = Pipeline(path, **options).generate("x", GenerationConfig(max_new_tokens=4))
    assert len(result.token_ids) == 4
