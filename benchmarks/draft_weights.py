"""Two bundles of one target with the same draft compressed two ways (say int8 and int4 weights), side by side in
one process: the default algorithm with each draft against the target alone, on the code prompts, interleaved.

    python benchmarks/draft_weights.py BUNDLE_A BUNDLE_B [--prompts 6] [--repeats 1] [--max-new-tokens 128]

Both bundles must hold the same target (the target alone runs from BUNDLE_A). Each generation is what
`edge-specdec run --chat --ignore-eos` does (greedy, the chat template). Prints per prompt each arm's tokens/s,
acceptance and tokens per target pass, then the medians of the ratios to the target alone, and checks that every
arm writes the target alone's tokens. A draft's weights change what it proposes, never what is written.
"""
from __future__ import annotations

import argparse
import statistics

from edge_specdec.benchmark.prompt_set import load_prompt_set
from edge_specdec.runtime import GenerationConfig, Pipeline
from edge_specdec.runtime.settings import SpeculativeConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle_a")
    ap.add_argument("bundle_b")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    a = ap.parse_args()
    pipes = {"A": Pipeline(a.bundle_a, static_shapes=False), "B": Pipeline(a.bundle_b, static_shapes=False)}
    config = GenerationConfig(max_new_tokens=a.max_new_tokens, ignore_eos=True,  # with the demo's penalty, as `run`
                              repetition_penalty=pipes["A"].default_config.repetition_penalty)
    prompts = [p["text"] for p in load_prompt_set()["code_generation"]][:a.prompts]
    texts = [pipes["A"].chat_prompt([{"role": "user", "content": p}]) for p in prompts]
    arms = {"alone": ("A", "none"), "A": ("A", "auto"), "B": ("B", "auto")}
    for pipe_name, alg in arms.values():  # uncounted: each kind of call's first time
        pipes[pipe_name].generate(texts[0], config, SpeculativeConfig(algorithm=alg))
    ratios = {"A": [], "B": []}
    same, runs = 0, 0
    for repeat in range(a.repeats):
        for i, text in enumerate(texts):
            order = list(arms) if (i + repeat) % 2 == 0 else list(reversed(arms))
            got = {arm: pipes[arms[arm][0]].generate(text, config, SpeculativeConfig(algorithm=arms[arm][1]))
                   for arm in order}
            alone = got["alone"].stats.tokens_per_s
            line = [f"prompt {i + 1}: alone {alone:.1f} tok/s"]
            for arm in ("A", "B"):
                s = got[arm].stats
                ratios[arm].append(s.tokens_per_s / alone)
                same += got[arm].token_ids == got["alone"].token_ids
                runs += 1
                draft_ms = 1000 * s.draft_seconds / max(1, s.rounds)
                line.append(f"{arm} {s.tokens_per_s:.1f} tok/s ({ratios[arm][-1]:.2f}x, acceptance "
                            f"{s.acceptance:.2f}, {s.tokens_per_target_pass:.2f} a pass, draft {draft_ms:.0f} ms a "
                            f"round, paused {s.rounds_drafting_paused})")
            print(" | ".join(line), flush=True)
    for arm, bundle in (("A", a.bundle_a), ("B", a.bundle_b)):
        print(f"{arm} ({bundle}): median {statistics.median(ratios[arm]):.2f}x the target alone in tokens/s")
    print(f"B / A, median of the paired ratios: "
          f"{statistics.median(b / x for b, x in zip(ratios['B'], ratios['A'])):.3f}; identical {same}/{runs}")


if __name__ == "__main__":
    main()
