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
from support import bits

ROOT = Path(os.environ.get("EDGE_SPECDEC_REAL_MODELS", Path.home() / ".cache/edge-specdec/real-models"))
pytestmark = [
    pytest.mark.real_models,
    pytest.mark.skipif(os.environ.get("EDGE_SPECDEC_REAL_MODELS_TESTS") != "1",
                       reason="opt-in: set EDGE_SPECDEC_REAL_MODELS_TESTS=1"),
    pytest.mark.skipif(not (ROOT / "hf").is_dir(), reason=f"{ROOT}/hf missing: run get-real-models.sh"),
]


def test_real_heterogeneous_pair(tmp_path):
    """Qwen2.5-Coder-0.5B (int8) + SmolLM2-135M (int8) from their folders: overlap and tokenizer parity."""
    import openvino as ov
    from transformers import AutoTokenizer

    folders = {"target": ROOT / "hf/qwen2.5-coder-0.5b-instruct", "draft": ROOT / "hf/smollm2-135m-instruct"}
    out = export_bundle(str(folders["target"]), str(folders["draft"]), tmp_path / "b",
                        target_weights=WeightSettings("int8"), draft_weights=WeightSettings("int8"), progress=print)
    bundle = load_bundle(out)
    vocab = bundle.vocabulary
    print(vocab)
    assert vocab["relation"] == "heterogeneous" and 35_000 < vocab["intersection"] < 45_000
    core = ov.Core()
    for entry in (bundle.target, bundle.draft):
        hf = AutoTokenizer.from_pretrained(folders[entry.role])
        encode = core.compile_model(entry.tokenizer_xml, "CPU")
        for text in HOSTILE_STRINGS:
            assert encode([text])["input_ids"][0].tolist() == hf(text)["input_ids"], (entry.role, text)
    vmap = bundle.load_vocab_map()
    eos = bundle.draft.special_tokens["eos_token_id"]
    mapped = [i for i in np.flatnonzero(vmap.draft_to_target >= 0) if i != eos]
    assert all(vmap.draft.piece(i) == vmap.target.piece(vmap.draft_to_target[i]) for i in mapped)


def test_real_gguf_source_is_read_and_its_tokenizer_checked(tmp_path):
    """SmolLM2 from its GGUF file: its tokenizer is rebuilt from the file's own tokenizer.ggml fields, as llama.cpp
    reads them (transformers' GGUF reader gave one that disagreed even on 'Hello world', which export refused), so
    the bundle's tokenizer writes the ids of the model's own Hugging Face tokenizer."""
    import openvino as ov
    from transformers import AutoTokenizer

    bundle = load_bundle(export_bundle(str(ROOT / "gguf/SmolLM2-135M-Instruct.Q4_1.gguf"), None, tmp_path / "b",
                                       target_weights=WeightSettings("int8"), progress=print))
    hf = AutoTokenizer.from_pretrained(ROOT / "hf/smollm2-135m-instruct")
    encode = ov.Core().compile_model(bundle.target.tokenizer_xml, "CPU")
    for text in ["Hello world", *HOSTILE_STRINGS[:8]]:
        assert encode([text])["input_ids"][0].tolist() == hf(text)["input_ids"], text


REAL_PAIR_BUNDLE = Path.home() / ".cache/edge-specdec/bundles/qwen1.5b-int4+smollm2-135m-int8"
CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
REAL_PROMPTS = [CHAT.format("Write a Python function that checks whether a string is a palindrome."),  # code
                "def merge_sorted(a, b):\n    \"\"\"Merge two sorted lists.\"\"\"\n",               # code completion
                CHAT.format("Explain in three sentences why the sky is blue."),                       # chat
                CHAT.format("Summarize in one sentence: The council agreed to fund a larger library near the "
                            "river, with a reading room for children and longer weekend hours."),    # summarization
                CHAT.format("Translate to French and add an emoji: 'good morning, 世界'")]           # hostile text


def test_real_heterogeneous_pair_greedy_is_lossless(tmp_path):
    """Qwen2.5-Coder-1.5B int4 + SmolLM2-135M int8: SLEM and TLI write exactly what the target alone writes.

    Uses the bundle of benchmarks/export_real_models.py when it exists, else exports the pair here (~2 min)."""
    from edge_specdec.runtime import GenerationConfig, Pipeline

    bundle = REAL_PAIR_BUNDLE
    if not bundle.is_dir():
        bundle = export_bundle(str(ROOT / "hf/qwen2.5-coder-1.5b-instruct"), str(ROOT / "hf/smollm2-135m-instruct"),
                               tmp_path / "b", target_weights=WeightSettings("int4"),
                               draft_weights=WeightSettings("int8"), progress=print)
    pipe = Pipeline(bundle)
    concurrent = Pipeline(bundle, concurrent=True)  # drafting during verification must not change a token
    accepted = drafted_ahead = 0
    for prompt in REAL_PROMPTS:
        config = GenerationConfig(max_new_tokens=48)
        base = pipe.generate(prompt, config, algorithm="none")
        for algorithm in ("slem", "tli"):
            # the draft model drafts every round (free copies are measured by `bench workloads`)
            spec = pipe.generate(prompt, config, algorithm=algorithm, num_assistant_tokens=4, confidence=0.0,
                                 lookup=False)
            print(algorithm, spec.stats.as_dict()["acceptance"], repr(spec.text[:60]))
            assert spec.token_ids == base.token_ids, (algorithm, prompt)
            accepted += spec.stats.draft_tokens_accepted
        ahead = concurrent.generate(prompt, config, algorithm="slem", num_assistant_tokens=4, confidence=0.0,
                                    lookup=False)
        assert ahead.token_ids == base.token_ids, ("concurrent slem", prompt)
        drafted_ahead += ahead.stats.drafted_ahead_used
    assert accepted > 0 and drafted_ahead > 0


def _exact_then_reused(engine, ids: list[int], config, more: int) -> int:
    """On `ids`, `auto` gives the target alone's ids and logprob bits; a longer second request (its answer and `more`
    prompt tokens after it) on the target alone's session reuses its cache and writes what a fresh session writes.
    Returns the prompt tokens the second request reused."""
    first = engine.session()
    alone = first.generate(ids, config, algorithm="none")
    drafted = engine.session().generate(ids, config, algorithm="auto")
    assert drafted.exact and drafted.token_ids == alone.token_ids and bits(drafted.logprobs) == bits(alone.logprobs)
    longer = ids + alone.token_ids + ids[:more]
    reused = first.generate(longer, config, algorithm="auto")
    fresh = engine.session().generate(longer, config, algorithm="none")
    assert reused.token_ids == fresh.token_ids and bits(reused.logprobs) == bits(fresh.logprobs)
    return reused.stats.prompt_tokens_reused


def test_real_target_is_exact_after_a_long_prompt():
    """The 1.5B int4 target on a CPU whose kernels change bits for calls of more than about 80 tokens (AVX2): a
    150-token prompt gives the target alone's logprob bits with `auto`, and again on a second request that reuses
    the first's cache (session.py, "Long blocks"); before the pieces the target failed its check and runs said
    `exact: false`."""
    from edge_specdec.runtime import Engine, GenerationConfig

    if not REAL_PAIR_BUNDLE.is_dir():
        pytest.skip(f"{REAL_PAIR_BUNDLE} missing: run benchmarks/export_real_models.py")
    engine = Engine(REAL_PAIR_BUNDLE)
    assert engine.target_model.block_invariant, engine.target_model.exactness_note
    ids = engine.tokenizer.encode("\n".join(HOSTILE_STRINGS) * 4)[:150]
    assert len(ids) == 150
    config = GenerationConfig(max_new_tokens=16, logprobs=True, ignore_eos=True)
    assert _exact_then_reused(engine, ids, config, more=20) > 150


@pytest.mark.parametrize("length", [2100, 2048, 1100])
def test_real_target_prefilled_in_bf16_is_exact_after_a_long_prompt(length, monkeypatch):
    """With --long-prompt-precision bf16 on a CPU with bf16 arithmetic: a long prompt prefilled on the bf16 copy gives
    the target alone's logprob bits with `auto`, and a longer second request that reuses what the copy wrote of the
    first's prompt (and only that: the rest went in another layout) writes what a fresh session writes (session.py,
    "A long prompt's prefill in bf16"). 2048 tokens leave the copy a last call of 1023, padded to 1024: a run without
    the pad writes the same bits; 1100 tokens are just past the threshold."""
    import openvino as ov

    from edge_specdec.runtime import Engine, GenerationConfig
    from edge_specdec.runtime import session as session_module

    if not REAL_PAIR_BUNDLE.is_dir():
        pytest.skip(f"{REAL_PAIR_BUNDLE} missing: run benchmarks/export_real_models.py")
    if "BF16" not in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        pytest.skip("this CPU has no bf16 arithmetic")
    engine = Engine(REAL_PAIR_BUNDLE, long_prompt_precision="bf16")
    assert engine.target_model.prefill is not None, engine.long_prompt_note
    text = (Path(__file__).parent.parent / "edge_specdec" / "runtime" / "session.py").read_text()
    ids = engine.tokenizer.encode(text)[:length]
    assert len(ids) == length
    config = GenerationConfig(max_new_tokens=24, logprobs=True, ignore_eos=True)
    assert _exact_then_reused(engine, ids, config, more=40) == length - 1  # what the copy wrote: all but the last token
    if length % session_module.PREFILL_ALIGN == 0:
        padded = engine.session().generate(ids, config, algorithm="none")
        monkeypatch.setattr(session_module, "PREFILL_PAD_MOST", 0.0)
        unpadded = engine.session().generate(ids, config, algorithm="none")
        assert unpadded.token_ids == padded.token_ids and bits(unpadded.logprobs) == bits(padded.logprobs)


def test_real_chat_question_after_a_long_document_reuses_the_whole_cache():
    """The real target's chat template marks the turns (session.py, "A chat's turns"): after a document of about 1500
    tokens, prefilled on the bf16 copy where this CPU has one, a question reuses the whole cache, the answer too, and
    writes what a fresh session writes on its prompt; so does the next one once another conversation took the slot and
    the server's prefix store gave the cache back."""
    from edge_specdec.runtime import Engine, GenerationConfig
    from edge_specdec.serve.prefix_store import PrefixStore

    if not REAL_PAIR_BUNDLE.is_dir():
        pytest.skip(f"{REAL_PAIR_BUNDLE} missing: run benchmarks/export_real_models.py")
    engine = Engine(REAL_PAIR_BUNDLE)
    assert engine.answer_opening == tuple(engine.tokenizer.encode("<|im_start|>assistant\n", add_special=False))
    text = (Path(__file__).parent.parent / "edge_specdec" / "runtime" / "conversation.py").read_text()[:6500]
    chat = engine.start_chat()
    config = GenerationConfig(max_new_tokens=24, logprobs=True, ignore_eos=True)
    chat.ask(f"```python\n{text}\n```\n\nWhat does this code do?", config)
    first_end = chat.session.target.sequences_from
    assert first_end is not None and first_end >= 1024

    def check_turn(result, fed: int) -> None:
        """The turn reused all the cache held (fed tokens) and wrote what a fresh session writes on its prompt."""
        prompt = chat.ids[:len(chat.ids) - len(chat._tokens_of(result))]
        assert result.stats.prompt_tokens_reused == fed and chat.session.target.sequences_from == first_end
        fresh = engine.session().generate(prompt, config)
        assert fresh.token_ids == result.token_ids and bits(fresh.logprobs) == bits(result.logprobs)

    fed = len(chat.ids) - 1  # the first prompt and its answer but the answer's last token
    check_turn(chat.ask("And what does ask() return?", config), fed)
    store, fed = PrefixStore(max_bytes=1 << 30), len(chat.ids) - 1
    other = engine.chat_prompt([{"role": "user", "content": "Say hi."}])
    assert store.prepare(chat.session, other).stored  # another conversation takes the slot
    chat.session.generate(other, GenerationConfig(max_new_tokens=4))
    chat.add("user", "Which method renders the prompt?")
    assert store.prepare(chat.session, chat.prompt_ids()).restored
    check_turn(chat.answer(config), fed)
