"""Does the draft propose better under a repetition penalty if it applies the penalty itself? (issue 33, item 6)

    python benchmarks/draft_penalty.py BUNDLE [--penalty 1.2] [--max-new-tokens 128] [--prompts 3] [--repeats 1]

The runtime's draft proposes from its unpenalized logits; the target's choices are penalized, and the proposals
are only proposals, so the output is the target's either way. This script measures two ways the draft could
follow the penalty, by replacing the text drafters' `shape` (SLEM and SLRS pick their tokens from it) for the
run, against the drafter as it is:

- own: the penalty over the draft's own tokens of the text so far and of this round's draft (what commit
  501278b tried on the demo);
- mapped: the penalty over the draft tokens that spell the same bytes as a target token of the sequence (the
  tokens the target penalizes, seen through the vocabulary map), and this round's draft.

Each prompt runs the bundle's default algorithm (a text drafter for a different-vocabulary pair) with greedy
decoding and the penalty, the drafting guard off (it stops drafting where drafting loses), in one warm engine,
the three variants interleaved; prints acceptance, target tokens per pass and tokens/s per variant, and checks
that every variant writes the target alone's tokens. `remember_sequence` and `install` patch the
drafter classes of this process only; the runtime itself has neither variant (benchmarks/RESULTS.md says why).
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from edge_specdec import Engine, GenerationConfig
from edge_specdec.benchmark.prompt_set import load_prompt_set
from edge_specdec.runtime import heterogeneous
from edge_specdec.runtime.sampling import penalize
from edge_specdec.vocab_map import NO_TOKEN

AS_IS = heterogeneous._TextDrafter.shape
VARIANTS = ("as is", "own", "mapped")


def install(variant: str, engine: Engine) -> None:
    """Make the text drafters pick their tokens the variant's way (for this process)."""
    if variant == "as is":
        heterogeneous._TextDrafter.shape = AS_IS
        return
    target_to_draft = engine.vocab_map.target_to_draft

    def shape(self, row, after=()):
        row = AS_IS(self, row, after)
        config = self.config
        if row is None or config.repetition_penalty == 1.0:
            return row
        if variant == "own":
            seen = self.ctx.ids + list(after)
        else:
            mapped = target_to_draft[np.asarray(self.ctx.target_sequence, dtype=np.int64)]
            seen = [int(t) for t in mapped if t != NO_TOKEN] + list(after)
        return penalize(row[None], config, seen, [])[0]

    heterogeneous._TextDrafter.shape = shape


def remember_sequence(drafter_class) -> None:
    """Let a drafter's shape see the target's sequence of the round (the `mapped` variant needs it)."""
    propose = drafter_class.propose

    def wrapped(self, sequence, k):
        self.ctx.target_sequence = sequence
        return propose(self, sequence, k)

    drafter_class.propose = wrapped


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--penalty", type=float, default=1.2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=1)
    a = ap.parse_args()
    engine = Engine(a.bundle)
    algorithm = engine.resolve_algorithm("auto")
    remember_sequence(heterogeneous.SLEMDrafter)
    prompts = [p["text"] for p in load_prompt_set()["code_generation"]][:a.prompts]
    config = GenerationConfig(max_new_tokens=a.max_new_tokens, ignore_eos=True, repetition_penalty=a.penalty)
    session = engine.session()
    render = (lambda text: engine.chat_prompt([{"role": "user", "content": text}])) if engine.chat_template \
        else (lambda text: text)
    session.generate(render("warm up"), GenerationConfig(max_new_tokens=8))
    rows = {variant: {"accepted": 0, "proposed": 0, "passes": 0, "tokens": 0, "speed": []} for variant in VARIANTS}
    same = total = 0
    print(f"{a.bundle}: {algorithm}, repetition penalty {a.penalty}, {a.max_new_tokens} tokens")
    for repeat in range(a.repeats):
        for i, prompt in enumerate(prompts):
            reference = session.generate(render(prompt), config, algorithm="none").token_ids
            order = VARIANTS[(i + repeat) % 3:] + VARIANTS[:(i + repeat) % 3]
            for variant in order:
                install(variant, engine)
                start = time.perf_counter()
                result = session.generate(render(prompt), config, algorithm=algorithm, guard=False)
                seconds = time.perf_counter() - start
                stats, row = result.stats, rows[variant]
                row["accepted"] += stats.draft_tokens_accepted
                row["proposed"] += stats.draft_tokens_proposed
                row["passes"] += stats.target_passes
                row["tokens"] += stats.new_tokens
                row["speed"].append(stats.new_tokens / seconds)
                same += result.token_ids == reference
                total += 1
                print(f"  prompt {i + 1} {variant:7s}: acceptance {stats.draft_tokens_accepted}/"
                      f"{stats.draft_tokens_proposed}, {stats.new_tokens / stats.target_passes:.2f} tokens per "
                      f"pass, {stats.new_tokens / seconds:.1f} tokens/s", flush=True)
    install("as is", engine)
    print("\n| draft | acceptance | tokens per pass | tokens/s (median) |\n|---|---|---|---|")
    for variant, row in rows.items():
        acceptance = row["accepted"] / max(1, row["proposed"])
        print(f"| {variant} | {acceptance:.3f} ({row['accepted']}/{row['proposed']}) | "
              f"{row['tokens'] / row['passes']:.2f} | {statistics.median(row['speed']):.1f} |")
    print(f"\nidentical to the target alone: {same}/{total}")


if __name__ == "__main__":
    main()
