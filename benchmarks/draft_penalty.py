"""The draft under the request's repetition penalty, against the draft without it: acceptance and tokens per pass.

    python benchmarks/draft_penalty.py BUNDLE [--penalty 1.2] [--prompts 6] [--max-new-tokens 128]

One process, the bundle's default algorithm named explicitly (no guard), greedy with the penalty, the code
prompts of the prompt set through the chat template (plain text for a bundle without one); each prompt runs
with the draft penalized (as shipped) and unpenalized (penalize_draft replaced by the identity), interleaved.
Both must write the target alone's tokens; the draft's proposals are all that differ.
"""
from __future__ import annotations

import argparse
import statistics

from edge_specdec.benchmark.prompt_set import load_prompt_set
from edge_specdec.runtime import GenerationConfig, Pipeline, heterogeneous


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--penalty", type=float, default=1.2)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    a = ap.parse_args()
    pipe = Pipeline(a.bundle)
    algorithm = pipe.resolve_algorithm("auto")
    config = GenerationConfig(max_new_tokens=a.max_new_tokens, repetition_penalty=a.penalty, ignore_eos=True)
    texts = [p["text"] for p in load_prompt_set()["code_generation"]][:a.prompts]
    prompts = [pipe.chat_prompt([{"role": "user", "content": t}]) if pipe.chat_template else t for t in texts]
    shipped = heterogeneous.penalize_draft
    rows = {"penalized draft": [], "unpenalized draft": []}
    alone = [pipe.generate(p, config, algorithm="none").token_ids for p in prompts]
    for i, prompt in enumerate(prompts):
        for name in (rows if i % 2 == 0 else reversed(list(rows))):
            heterogeneous.penalize_draft = shipped if name == "penalized draft" else (lambda row, *rest: row)
            result = pipe.generate(prompt, config, algorithm=algorithm)
            assert result.token_ids == alone[i], (name, i)
            rows[name].append(result.stats)
    heterogeneous.penalize_draft = shipped
    print(f"{a.bundle}: {algorithm}, repetition penalty {a.penalty}, {len(prompts)} prompts x {a.max_new_tokens} "
          f"tokens, every run identical to the target alone")
    for name, stats in rows.items():
        proposed = sum(s.draft_tokens_proposed for s in stats)
        accepted = sum(s.draft_tokens_accepted for s in stats)
        print(f"  {name:<18} acceptance {accepted / max(1, proposed):.3f} ({accepted}/{proposed}), tokens per pass "
              f"{statistics.median(s.tokens_per_target_pass for s in stats):.2f} (median), tokens/s "
              f"{statistics.median(s.tokens_per_s for s in stats):.1f}")


if __name__ == "__main__":
    main()
