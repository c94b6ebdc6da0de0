"""A Hugging Face folder of a random-weight model of a known shape (Qwen2.5-1.5B / 3B / 7B), optionally with fewer
layers, for `edge-specdec export` (what a pass costs does not depend on the weights' values).

The whole 3B in fp32 (the export converts from fp32) would take about 12 GB, the 7B 30 GB: more than a small
machine spares. So the models are built at the real widths, vocabulary and heads, with fewer layers, and
benchmarks/target_sizes.py measures two depths and projects the cost to the full depth (a layer's cost is the same
at every depth; the embedding and the output layer are paid once). The weights are bf16 on disk (normal, std
0.02; norms 1), built on the meta device and filled tensor by tensor; the tokenizer is copied from a Qwen2.5 folder
(--tokenizer-from). Keep the folders outside the repository:

    python benchmarks/random_target.py qwen2.5-3b --layers 6 --out ~/.cache/edge-specdec/random-models/qwen2.5-3b-L6
    edge-specdec export --target ~/.cache/edge-specdec/random-models/qwen2.5-3b-L6 \
        --out ~/.cache/edge-specdec/random-bundles/qwen2.5-3b-L6
"""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

# the published configs' shapes (config.json of Qwen/Qwen2.5-1.5B-Instruct, -3B-Instruct, -7B-Instruct)
SHAPES = {
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "qwen2.5-3b": dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
                       num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    # untied in the published model; tied here to halve the memory of the export (the output layer's cost is the
    # same: NNCF leaves it int8 either way, and the embedding's lookup costs nothing)
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=True),
}
COMMON = dict(max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6, hidden_act="silu",
              bos_token_id=151643, eos_token_id=151645, use_sliding_window=False, max_window_layers=28)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "chat_template.jinja",
                   "generation_config.json", "special_tokens_map.json")
DEFAULT_TOKENIZER = Path.home() / ".cache/edge-specdec/real-models/hf/qwen2.5-coder-1.5b-instruct"


def build(shape: str, layers: int | None, out: Path, tokenizer_from: Path, seed: int = 0) -> Path:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    fields = {**COMMON, **SHAPES[shape]}
    if layers:
        fields.update(num_hidden_layers=layers, max_window_layers=layers)
    config = Qwen2Config(**fields, torch_dtype="bfloat16")
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    model = model.to_empty(device="cpu").to(torch.bfloat16)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.fill_(1.0)
            elif name.endswith(".bias"):
                parameter.zero_()
            else:
                parameter.normal_(0.0, 0.02, generator=generator)
    # the rotary inverse frequencies are a buffer that is not saved (recomputed when the folder is loaded)
    model.tie_weights()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (tokenizer_from / name).is_file() and name != "generation_config.json":
            shutil.copy2(tokenizer_from / name, out / name)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("shape", choices=sorted(SHAPES))
    p.add_argument("--layers", type=int, help="fewer layers than the shape's (default: all)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tokenizer-from", type=Path, default=DEFAULT_TOKENIZER)
    args = p.parse_args()
    print(build(args.shape, args.layers, args.out.expanduser(), args.tokenizer_from.expanduser()))


if __name__ == "__main__":
    main()
