"""Session-scoped fixtures: tiny tokenizers, tiny models and exported bundles, each built once per run."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "models"))
from tiny_pair import build_model, train_tokenizer  # noqa: E402

# Tokenizer styles and their vocabulary sizes.
TOKENIZERS = {"bytelevel": 700, "metaspace": 600, "prefixspace": 500}
# name: (architecture, tokenizer style, hidden size, seed)
MODELS = {
    "qwen2-bytelevel": ("qwen2", "bytelevel", 64, 0),          # the target of every tiny pair
    "qwen2-bytelevel-small": ("qwen2", "bytelevel", 32, 1),    # same-vocabulary draft
    "llama-metaspace": ("llama", "metaspace", 32, 2),          # Llama-2 style tokenizer draft
    "gpt2-prefixspace": ("gpt2", "prefixspace", 32, 3),        # prefix-space tokenizer draft
    "llama-metaspace-large": ("llama", "metaspace", 64, 4),    # targets of the other tokenizer styles
    "gpt2-prefixspace-large": ("gpt2", "prefixspace", 64, 5),
    "qwen2-bytelevel-padded": ("qwen2", "bytelevel", 32, 6, 4),  # same-vocabulary draft with 4 more logits
}


@pytest.fixture(scope="session", autouse=True)
def _offline():
    """The suite never touches a model hub."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("EDGE_SPECDEC_CACHE_DIR", "off")  # tests that use the compiled-model cache say so


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session")
def tokenizer_dir(workdir):
    cache: dict[str, Path] = {}

    def get(style: str) -> Path:
        if style not in cache:
            cache[style] = train_tokenizer(style, TOKENIZERS[style], workdir / f"tok-{style}")
        return cache[style]
    return get


@pytest.fixture(scope="session")
def model_dir(workdir, tokenizer_dir):
    cache: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in cache:
            arch, style, hidden, seed, *pad = MODELS[name]
            cache[name] = build_model(arch, tokenizer_dir(style), workdir / f"model-{name}", seed=seed, hidden=hidden,
                                      vocab_pad=pad[0] if pad else 0)
        return cache[name]
    return get


@pytest.fixture(scope="session")
def bundle_dir(workdir, model_dir):
    """bundle_dir(target, draft, target_format, draft_format) -> an exported bundle, exported once per session."""
    from edge_specdec.export import WeightSettings, export_bundle

    cache: dict[tuple, Path] = {}

    def get(target: str, draft: str | None, target_format: str = "int4", draft_format: str = "int8") -> Path:
        key = (target, draft, target_format, draft_format)
        if key not in cache:
            out = workdir / "bundles" / "__".join(str(k) for k in key)
            cache[key] = export_bundle(str(model_dir(target)), str(model_dir(draft)) if draft else None, out,
                                       target_weights=WeightSettings(target_format),
                                       draft_weights=WeightSettings(draft_format))
        return cache[key]
    return get
