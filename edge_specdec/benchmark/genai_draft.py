"""--genai-draft, for either benchmark: a bundle of the same target whose draft shares its vocabulary, which
GenAI's speculative rows draft with when the benchmarked bundle's own draft has another vocabulary."""
from __future__ import annotations

from pathlib import Path
from typing import Union

from ..errors import EdgeSpecdecError


def check_genai_draft(bundle, other) -> None:
    """--genai-draft (both benchmarks) must be a bundle of the same target (the same weights and tokenizer files,
    by the manifests' checksums) whose draft shares that target's vocabulary."""
    if other.draft is None or other.vocabulary["relation"] != "identical":
        relation = "no draft" if other.draft is None else f"vocabulary relation {other.vocabulary['relation']!r}"
        raise EdgeSpecdecError(f"--genai-draft {other.path}: its draft must share its target's vocabulary (GenAI's "
                               f"speculative decoding needs that), but that bundle has {relation}. Give a bundle "
                               f"exported with a same-vocabulary draft, e.g. Qwen2.5-Coder-0.5B for a Qwen2.5 "
                               f"target.")
    ours, theirs = bundle.manifest.get("files", {}), other.manifest.get("files", {})
    # the .xml files hold generated node names that differ from one export to the next; the .bin files hold the
    # weights and the tokenizer's constants
    for name in ("target/openvino_model.bin", "target/openvino_tokenizer.bin", "target/openvino_detokenizer.bin"):
        a, b = ours.get(name, {}).get("sha256"), theirs.get(name, {}).get("sha256")
        if a is None or a != b:
            what = "weights" if "model" in name else "tokenizer"
            raise EdgeSpecdecError(
                f"--genai-draft {other.path} has another target than {bundle.path}: its target's {what} "
                f"({name}) differ{'' if a and b else ' or are not in a manifest'} "
                f"(sha256 {str(b)[:12]} vs {str(a)[:12]}). Give a bundle exported from the same target with the "
                f"same weight settings, whose draft has that target's vocabulary.")


def load_genai_draft(bundle, genai_draft: Union[str, Path, None], genai_on: bool):
    """--genai-draft for either benchmark: None when not given, else that bundle, checked by check_genai_draft;
    refused when GenAI's rows are left out."""
    if genai_draft is None:
        return None
    from ..bundle import load_bundle

    if not genai_on:
        raise EdgeSpecdecError("--genai-draft is for GenAI's speculative rows, and --no-genai leaves GenAI out: "
                               "drop one of them.")
    other = load_bundle(genai_draft, verify=False)
    check_genai_draft(bundle, other)
    return other
