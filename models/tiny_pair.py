"""Tiny tokenizers and models built on the spot: the test suite's fixtures, and a pair to try the tool on.

    python models/tiny_pair.py OUT_DIR     # writes OUT_DIR/target and OUT_DIR/draft (Hugging Face folders)

Three tokenizer styles, trained locally with the `tokenizers` library on text every machine has
(the Python standard library's own source and docstrings):
- "bytelevel": GPT-2 style byte-level BPE (bytes mapped to printable characters, G-with-dot space marker).
- "metaspace": Llama-2 style BPE, U+2581 space marker, a prepended space, <0xNN> byte fallback, BOS added.
- "prefixspace": byte-level BPE that prepends a space to the text (RoBERTa/OPT style), its own specials.
And three tiny random decoder architectures (Llama, Qwen2, GPT-2) sized for those vocabularies.
"""
from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path



def _corpus_text(max_chars: int = 400_000) -> list[str]:
    """Lines of Python source from the standard library: present on every machine."""
    import argparse, collections, json as _json, textwrap, string, difflib, email.message, http.client
    text = []
    for mod in (argparse, collections, _json.decoder, textwrap, string, difflib, email.message, http.client):
        text.append(inspect.getsource(mod))
    return "\n".join(text)[:max_chars].splitlines()


def _byte_tokens() -> list[str]:
    return [f"<0x{i:02X}>" for i in range(256)]


def train_tokenizer(style: str, vocab_size: int, out_dir: Path) -> Path:
    """Train a tokenizer of the given style and save it as a Hugging Face tokenizer folder."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    lines = _corpus_text()
    if style == "bytelevel":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tok.train_from_iterator(lines, trainer)
        specials = dict(bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token=None)
    elif style == "prefixspace":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
        tok.train_from_iterator(lines, trainer)
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
        specials = dict(bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    elif style == "metaspace":
        normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        base = Tokenizer(models.BPE(unk_token="<unk>"))
        base.normalizer = normalizer
        trainer = trainers.BpeTrainer(vocab_size=vocab_size - 256, special_tokens=["<unk>", "<s>", "</s>"],
                                      show_progress=False, max_token_length=12)
        base.train_from_iterator(lines, trainer)
        trained = json.loads(base.to_str())["model"]
        # Llama-2 layout: specials, then the 256 byte-fallback tokens as ordinary vocabulary, then merges.
        vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
        for t in _byte_tokens():
            vocab[t] = len(vocab)
        for t, _ in sorted(trained["vocab"].items(), key=lambda kv: kv[1]):
            if t not in vocab:
                vocab[t] = len(vocab)
        merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in trained["merges"]]
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
        tok.normalizer = normalizer
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
        tok.add_special_tokens(["<unk>", "<s>", "</s>"])
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
        specials = dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    else:
        raise ValueError(f"unknown tokenizer style {style!r}")

    hf = PreTrainedTokenizerFast(tokenizer_object=tok, **{k: v for k, v in specials.items() if v})
    out_dir.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(out_dir)
    return out_dir


def build_model(arch: str, tokenizer_dir: Path, out_dir: Path, seed: int = 0, hidden: int = 64, layers: int = 2,
                vocab_pad: int = 0) -> Path:
    """A tiny random decoder of the given architecture over the tokenizer in tokenizer_dir. vocab_pad: logits for
    that many ids past the tokenizer's (as models padded to a round vocabulary size have)."""
    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    ids = dict(vocab_size=len(tok) + vocab_pad, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
               pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    if arch == "llama":
        cfg = LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, **ids)
        model = LlamaForCausalLM(cfg)
    elif arch == "qwen2":
        cfg = Qwen2Config(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                          tie_word_embeddings=True, **ids)
        model = Qwen2ForCausalLM(cfg)
    elif arch == "gpt2":
        cfg = GPT2Config(n_embd=hidden, n_layer=layers, n_head=4, n_positions=512, **ids)
        model = GPT2LMHeadModel(cfg)
    else:
        raise ValueError(f"unknown architecture {arch!r}")
    if not cfg.tie_word_embeddings:  # a sharper output distribution than the default random init gives
        with torch.no_grad():
            model.lm_head.weight.mul_(4.0)
    model.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


def build_pair(out: Path) -> tuple[Path, Path]:
    """A tiny random Qwen2-style target (byte-level BPE) and Llama-style draft (U+2581 BPE): different vocabularies."""
    target = build_model("qwen2", train_tokenizer("bytelevel", 700, out / "tok-target"), out / "target", hidden=64)
    draft = build_model("llama", train_tokenizer("metaspace", 600, out / "tok-draft"), out / "draft", seed=1, hidden=32)
    return target, draft


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python models/tiny_pair.py OUT_DIR")
    for path in build_pair(Path(sys.argv[1])):
        print(path)
