"""Are speculative runs on a long prompt bit-exact on this machine? A prompt of N tokens (this package's own source
as text), 24 greedy tokens with logprobs: the target alone against `auto` on fresh sessions, then a second request
that extends the first by its answer and 40 tokens, on the first session (prefix reuse) against a fresh one. Prints
whether token ids and logprob bits agree, and the `exact` flag the run reported.

    python benchmarks/long_prompt_exactness.py BUNDLE [--lengths 150 400]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from edge_specdec.runtime import Engine, GenerationConfig


def bits(result) -> list[int]:
    return [np.float64(entry.logprob).view(np.int64) for entry in result.logprobs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle")
    parser.add_argument("--lengths", type=int, nargs="+", default=[150, 400])
    args = parser.parse_args()
    engine = Engine(args.bundle)
    source = Path(__file__).resolve().parents[1] / "edge_specdec" / "runtime" / "generate.py"
    ids = engine.tokenizer.encode(source.read_text()[:8000])
    config = GenerationConfig(max_new_tokens=24, logprobs=True, ignore_eos=True)
    print(f"target block-invariant: {engine.target_model.block_invariant}")
    for n in args.lengths:
        prompt = ids[:n]
        first = engine.session()
        alone = first.generate(prompt, config, algorithm="none")
        drafted = engine.session().generate(prompt, config, algorithm="auto")
        print(f"{n} tokens, fresh sessions: ids equal {alone.token_ids == drafted.token_ids}, bits equal "
              f"{bits(alone) == bits(drafted)}, exact reported {drafted.exact}")
        longer = prompt + alone.token_ids + ids[n:n + 40]
        reused = first.generate(longer, config, algorithm="auto")
        fresh = engine.session().generate(longer, config, algorithm="none")
        print(f"{n} tokens, a second request on the same session ({reused.stats.prompt_tokens_reused} reused): ids "
              f"equal {reused.token_ids == fresh.token_ids}, bits equal {bits(reused) == bits(fresh)}, exact "
              f"reported {reused.exact}")


if __name__ == "__main__":
    main()
