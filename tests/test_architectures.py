"""Which architectures edge-specdec decodes exactly, as target and as draft, and the one-line refusals of those the
runtime cannot keep exact (docs/export.md#architectures-the-runtime-decodes).

- Fast: the refusals from config.json alone (no weights, no export), through export's checks, the command line, an
  OpenVINO IR folder and a bundle, and pair's look; and the configs that are admitted.
- Slow: Mistral with a sliding window smaller than the context, exported, its runtime logits against transformers'
  with and without the window, and speculative runs with it as target, as draft and as its own draft.
- Opt-in (EDGE_SPECDEC_ARCH_TESTS=1, marker `architectures`): the same for every architecture of ARCHS.

Each admitted architecture is a tiny random model built here from a transformers config over the suite's byte-level
tokenizer: as TARGET with the suite's Llama draft of another vocabulary (SLEM), as DRAFT for the suite's Qwen2 target
of the same vocabulary (standard), and as the draft of itself (its int8 copy drafting for its fp32 export), so that
drafts are accepted as well as rejected; every run's token ids and logprob bits equal the target alone's.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import built_once
from edge_specdec.cli import main
from edge_specdec.errors import ExportError
from edge_specdec.export import checks
from edge_specdec.export.ir_source import inspect_ir_folder
from edge_specdec.pairing.candidates import Source, admission, classify
from support import EXACTNESS_PROMPTS, OTHER_VOCAB, SAME_VOCAB, bits

ARCH_TESTS = os.environ.get("EDGE_SPECDEC_ARCH_TESTS") == "1"
WINDOW = 16  # the sliding window of the windowed models: shorter than a prompt and its answer

# name: (transformers config class, its settings beyond the common ones). Each is built with hidden size 64, 2 layers,
# 4 attention heads (2 key/value heads where the architecture has them) and a context of 512.
ARCHS = {
    "llama": ("LlamaConfig", {}),
    "mistral": ("MistralConfig", {"sliding_window": WINDOW}),
    "phi3": ("Phi3Config", {"sliding_window": WINDOW}),  # as Phi-3-mini-4k's 2047 in 4096
    "qwen2": ("Qwen2Config", {}),
    "qwen2-window": ("Qwen2Config", {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1}),
    "qwen3": ("Qwen3Config", {"head_dim": 16}),
    "starcoder2": ("Starcoder2Config", {"sliding_window": WINDOW}),
    "falcon": ("FalconConfig", {}),
    "gpt_neox": ("GPTNeoXConfig", {}),
    "llama-dynamic-rope": ("LlamaConfig", {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}),
    "gemma": ("GemmaConfig", {"head_dim": 16}),
    "gemma2": ("Gemma2Config", {"head_dim": 16}),
    "gemma3_text": ("Gemma3TextConfig", {"head_dim": 16, "sliding_window": WINDOW}),
}
DEFAULT_TIER = {"mistral"}  # the one architecture beyond the suite's Qwen2 / Llama / GPT-2 that every slow run covers
ROLES = ("target", "draft", "self")
PROMPTS = [EXACTNESS_PROMPTS[-3], EXACTNESS_PROMPTS[-1], EXACTNESS_PROMPTS[0]]
# greedy runs per role: (algorithm, options); each one's ids and logprob bits must be the target alone's
RUNS = {"target": [("slem", {}), ("slem", {"num_assistant_tokens": 3, "confidence": 0.0, "lookup": False})],
        "draft": [("standard", {}), ("standard", {"num_assistant_tokens": 3, "confidence": 0.0, "lookup": False})],
        "self": [("standard", {"num_assistant_tokens": 3, "confidence": 0.0, "lookup": False, "guard": False})]}


def tier(name: str) -> list:
    """The marks of an architecture's cases: the default tier's in the slow tier, the others opt-in."""
    marks = [pytest.mark.slow]
    if name not in DEFAULT_TIER:
        marks += [pytest.mark.architectures,
                  pytest.mark.skipif(not ARCH_TESTS, reason="opt-in: set EDGE_SPECDEC_ARCH_TESTS=1")]
    return marks


MATRIX = [pytest.param(name, role, marks=tier(name), id=f"{name}-{role}") for name in ARCHS for role in ROLES]
MODELS = [pytest.param(name, marks=tier(name), id=name) for name in ARCHS]


def build_arch(name: str, tokenizer_dir: Path, out: Path) -> Path:
    """A tiny random model of one of ARCHS over the tokenizer in tokenizer_dir, saved with it."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    class_name, extra = ARCHS[name]
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = getattr(transformers, class_name)(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id, **extra)
    torch.manual_seed(sum(map(ord, name)))
    model = AutoModelForCausalLM.from_config(config)
    if not config.tie_word_embeddings:  # a sharper output distribution than the random init gives, as tiny_pair's
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(4.0)
    model.eval()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def arch_dir(shared_dir, tokenizer_dir):
    """arch_dir(name) -> the tiny model's folder; skips, with the check's own words, an architecture that the
    installed optimum-intel and transformers cannot export (Gemma 2 and Gemma 3 with transformers 5.5.4)."""
    def get(name: str) -> Path:
        folder = built_once(shared_dir / f"arch-{name}",
                            lambda: build_arch(name, tokenizer_dir("bytelevel"), shared_dir / f"arch-{name}"))
        problem = checks.check_architecture(checks.folder_architecture(folder), "target", name)
        if problem is not None:
            pytest.skip(problem.message().replace("\n", " "))
        return folder
    return get


@pytest.fixture(scope="module")
def arch_bundle(shared_dir, model_dir, arch_dir):
    """arch_bundle(name, role) -> the bundle of the architecture in that role (see the module's docstring)."""
    from edge_specdec.export import WeightSettings, export_bundle

    def get(name: str, role: str) -> Path:
        folder = arch_dir(name)
        target, draft, weights = {
            "target": (folder, model_dir(OTHER_VOCAB[1]), ("fp32", "int8")),
            "draft": (model_dir(SAME_VOCAB[0]), folder, ("int8", "int8")),
            "self": (folder, folder, ("fp32", "int8")),
        }[role]
        out = shared_dir / "bundles" / f"arch-{name}-{role}"
        out.parent.mkdir(exist_ok=True)
        return built_once(out, lambda: export_bundle(
            str(target), str(draft), out, target_weights=WeightSettings(weights[0]),
            draft_weights=WeightSettings(weights[1]), allow_larger_draft=True, progress=lambda _: None))
    return get


@pytest.mark.parametrize("name, role", MATRIX)
def test_architecture_decodes_exactly(name, role, arch_bundle):
    """Every greedy run's token ids and logprob bits are the target alone's; a model drafting for itself gets
    drafts accepted."""
    from edge_specdec.runtime import GenerationConfig, Pipeline

    pipe = Pipeline(arch_bundle(name, role), cache_dir="off")
    config = GenerationConfig(max_new_tokens=16, ignore_eos=True, logprobs=True, top_logprobs=2)
    accepted = proposed = 0
    for prompt in PROMPTS:
        alone = pipe.generate(prompt, config, algorithm="none")
        assert alone.exact and len(alone.token_ids) == 16
        for algorithm, options in RUNS[role]:
            run = pipe.generate(prompt, config, algorithm=algorithm, **options)
            assert run.token_ids == alone.token_ids, (name, role, algorithm, options, prompt)
            assert bits(run.logprobs) == bits(alone.logprobs), (name, role, algorithm, options, prompt)
            accepted += run.stats.draft_tokens_accepted
            proposed += run.stats.draft_tokens_proposed
    print(f"{name} as {role}: {len(PROMPTS)} prompts x {len(RUNS[role])} runs of 16 tokens, ids and logprob bits "
          f"the target alone's; {accepted} of {proposed} drafted tokens accepted")
    if role == "self":
        assert accepted > 0


@pytest.mark.parametrize("name", MODELS)
def test_architecture_computes_the_models_logits(name, arch_bundle, arch_dir):
    """The runtime's target (the fp32 export) gives transformers' logits, up to float noise, on a prompt of 48
    tokens; for a windowed model they differ from the same weights without the window past it (the paged attention
    keeps each layer's window)."""
    import torch
    from transformers import AutoModelForCausalLM

    from edge_specdec.runtime import Pipeline

    pipe = Pipeline(arch_bundle(name, "self"), cache_dir="off")
    ids = list(range(5, 53))
    session = pipe.target
    session.reset()
    ours = session.feed(ids).astype(np.float64)
    session.reset()
    folder = arch_dir(name)
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        theirs = model(torch.tensor([ids])).logits[0].double().numpy()
    scale = np.abs(theirs).max()
    print(f"{name}: largest logit difference from transformers {np.abs(ours - theirs).max():.2e} "
          f"(largest logit {scale:.2f})")
    assert np.abs(ours - theirs).max() < 0.01 * scale, name
    window = getattr(model.config, "sliding_window", None)
    if window and window < len(ids):
        whole = type(model.config)(**{**model.config.to_dict(), "sliding_window": 10 ** 6})
        unwindowed = AutoModelForCausalLM.from_config(whole, attn_implementation="eager").eval()
        unwindowed.load_state_dict(model.state_dict())
        with torch.no_grad():
            plain = unwindowed(torch.tensor([ids])).logits[0].double().numpy()
        assert np.abs(plain[:window] - theirs[:window]).max() < 1e-9 * scale + 1e-6  # the same up to the window
        print(f"{name}: without its window of {window}, transformers' logits past it differ from ours by "
              f"{np.abs(ours[window:] - plain[window:]).max():.2e}")
        assert np.abs(ours[window:] - plain[window:]).max() > 10 * np.abs(ours - theirs).max()


# ---------------------------------------------------------------------------------------------------------------
# refusals, from config.json alone

def config_of(model_type: str, **settings) -> dict:
    """config.json as transformers writes it for this model type (its own defaults: the layer kinds it implies)."""
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **settings).to_dict()


PHI3_128K = dict(max_position_embeddings=131072, original_max_position_embeddings=4096,
                 rope_scaling={"rope_type": "longrope", "short_factor": [1.0] * 48, "long_factor": [2.0] * 48})
# model type, its settings, words of the refusal
REFUSED = [
    ("qwen3_next", {}, "linear_attention"),
    ("qwen3_5_text", {}, "linear_attention"),
    ("lfm2", {"layer_types": ["conv", "conv", "full_attention"], "num_hidden_layers": 3}, "2 of its 3 layers are conv"),
    ("granitemoehybrid", {"layer_types": ["mamba", "mamba", "attention"], "num_hidden_layers": 3},
     "2 of its 3 layers are mamba"),
    ("mamba", {}, "recurrent"),
    ("falcon_mamba", {}, "recurrent"),
    ("zamba2", {}, "hybrid, mamba"),
    ("jamba", {}, "recurrent"),
    ("bamba", {}, "recurrent"),
    ("nemotron_h", {}, "mamba"),
    ("phi3", PHI3_128K, "longrope"),
    ("gemma2", {}, "attn_logit_softcapping"),
    ("llama4_text", {}, "chunked_attention"),
]
ADMITTED = [
    ("phi3", {"sliding_window": 2047, "max_position_embeddings": 4096}),  # Phi-3-mini-4k
    ("phi3", {**PHI3_128K, "max_position_embeddings": 4096}),  # longrope that never passes its switch
    ("mistral", {"sliding_window": 4096, "max_position_embeddings": 32768}),  # Mistral-7B-v0.1
    ("qwen2", {"use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 21}),
    ("llama", {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}),
    ("llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}),
    ("qwen2", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}),
    ("granitemoehybrid", {"layer_types": ["attention"] * 4, "num_hidden_layers": 4}),  # Granite 4 micro
    ("gemma3_text", {}),
]


def write_config(folder: Path, config: dict) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("model_type, settings, words", REFUSED, ids=[r[0] for r in REFUSED])
def test_refused_in_one_line_from_config_json(model_type, settings, words, model_dir, tmp_path):
    """Export's check refuses before anything is converted or written, in one line naming the reason and what to
    use instead; pair's look says the same."""
    folder = write_config(tmp_path / model_type, config_of(model_type, **settings))
    with pytest.raises(ExportError) as caught:
        checks.check_sources({"target": str(model_dir(SAME_VOCAB[0])), "draft": str(folder)}, lambda _: None)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"--draft {folder}: {model_type}"), message
    assert words in message and "Use " in message and message.endswith("Nothing was converted or written.")
    refused = admission(classify(str(folder), "draft")[0])
    assert words in refused and "Use " in refused and "\n" not in refused


@pytest.mark.parametrize("model_type, settings", ADMITTED, ids=[a[0] for a in ADMITTED])
def test_admitted_by_the_runtime_check(model_type, settings):
    """Sliding windows (kept by the paged attention), static rope scalings, dynamic NTK within the context, longrope
    that never switches, and a hybrid type whose layers are all attention are not refused for the runtime."""
    assert checks.runtime_problem(config_of(model_type, **settings)) is None


def test_final_logit_softcapping_alone_is_admitted():
    """A softcap on the output logits is a tanh after the output layer, kept in the graph; only attention-logit
    softcapping is lost in the paged attention."""
    assert checks.runtime_problem(config_of("gemma2", attn_logit_softcapping=None)) is None
    assert "attn_logit_softcapping" in checks.runtime_problem(config_of("gemma2"))


def test_a_runtime_refusal_comes_before_a_version_fix(model_dir, tmp_path, capsys):
    """Qwen3-Next would need transformers 4.57.6 to export, but no version makes it decodable: the command line
    says the refusal alone, in one line, and writes nothing."""
    folder = write_config(tmp_path / "next", config_of("qwen3_next"))
    out = tmp_path / "bundles" / "b"
    code = main(["export", "--target", str(model_dir(SAME_VOCAB[0])), "--draft", str(folder), "--out", str(out),
                 "--check-only", "--quiet"])
    error = capsys.readouterr().err.strip()
    assert code == 1 and len(error.splitlines()) == 1 and "linear_attention" in error and "pip install" not in error
    assert not (tmp_path / "bundles").exists()


def test_an_ir_folder_and_a_bundle_whose_config_says_so_are_refused(bundle_dir, tmp_path):
    """An OpenVINO IR folder (an exported model, its config.json now a Qwen3-Next's) is refused by export's IR
    inspection in one line; a bundle holding it by pair's look."""
    bundle = tmp_path / "bundle"
    shutil.copytree(bundle_dir(*SAME_VOCAB), bundle)
    draft = bundle / "draft"
    config = json.loads((draft / "config.json").read_text())
    (draft / "config.json").write_text(json.dumps({**config, **config_of("qwen3_next", num_hidden_layers=4)}))
    with pytest.raises(ExportError) as caught:
        inspect_ir_folder(draft, "draft", str(draft))
    assert "\n" not in str(caught.value) and "3 of its 4 layers are linear_attention" in str(caught.value)
    refused = admission(Source(str(bundle), "bundle", draft, bundle.name), "draft")
    assert "linear_attention" in refused and "Use a Qwen3 model" in refused
    assert admission(Source(str(bundle), "bundle", bundle / "target", bundle.name), "target") == ""


def test_pair_refuses_a_hybrid_draft_in_one_line(model_dir, tokenizer_dir, tmp_path):
    """`edge-specdec pair`'s look reports a candidate with the target's tokenizer but recurrent layers as not usable,
    with the reason and what to use instead on its line."""
    from edge_specdec.cli.pair import describe
    from edge_specdec.pairing import PairSettings, find_pair

    folder = shutil.copytree(tokenizer_dir("bytelevel"), tmp_path / "next")
    (folder / "config.json").write_text(json.dumps(config_of("qwen3_next", num_hidden_layers=4)))
    report = find_pair(str(model_dir(SAME_VOCAB[0])), [str(folder)], PairSettings(look_only=True, top=1))
    row = next(r for r in report["candidates"] if r["name"] == "next")
    assert not row["admitted"] and row["relation"] == "identical"  # its vocabulary was read: refused for its layers
    assert "3 of its 4 layers are linear_attention" in row["refused"] and "\n" not in row["refused"]
    assert "not usable: qwen3_next has recurrent layers" in describe(report)
