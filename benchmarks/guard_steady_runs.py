"""The default after a long prompt, run after run with the drafting guard's verdict carried from each run to the
next, against the target alone on the same engine: many pairs of decodes, to judge a ratio of a few per cent on a
machine whose speed moves more than that from one run to the next.

    python benchmarks/guard_steady_runs.py BUNDLE [--length 8192] [--task summarize] [--pairs 16]

The engine opens as `edge-specdec bench long-prompts` opens it (its defaults, as the Python API and serve open it;
no draft pool), but keeps the prompt's KV in the target's cache: the first run prefills the suite's prompt of
--length tokens, every later run reuses it and decodes only, so a pair takes seconds, not minutes. The draft is
emptied before every run, so each run of the default that drafts pays the draft's prefill of its window, as a run
on a fresh prompt does. The guard's verdict for the prompt's kind of request is emptied once, before the first
pair (as at a user's first long prompts); from then on each run of the default starts from the verdict the one
before it left. Each pair runs the target alone and the default back to back, alternating which goes first;
printed per pair: both tokens/s after the first token, their ratio, the draft's seconds and the rounds the guard
ran the target alone; then the median ratio and the verdict left. The outputs are checked equal to the target
alone's.
"""
from __future__ import annotations

import argparse
import statistics

from edge_specdec.benchmark.suites.long_prompts import add_one_prompt_arguments, one_prompt


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n    python")[0])
    add_one_prompt_arguments(p)
    p.add_argument("--pairs", type=int, default=16, help="pairs of runs (the target alone and the default)")
    args = p.parse_args()
    pipe, ids, config = one_prompt(args, prefix_reuse=True)
    pipe.compile_static_copies()  # no copy compiles inside a timed run
    key = pipe.default_guard_key(config, len(ids))

    def run(algorithm: str):
        pipe.draft.reset()
        return pipe.generate(ids, config, algorithm=algorithm)

    run("none")  # uncounted: the prompt's prefill, and the first run of each size pays the plugin's preparations
    run("auto")
    pipe.measurements.put(pipe.guard_name(key), None, write=False)
    ratios = []
    for i in range(args.pairs):
        order = ("none", "auto") if i % 2 else ("auto", "none")
        got = dict(zip(order, (run(algorithm) for algorithm in order)))
        alone, default = got["none"], got["auto"]
        if default.token_ids != alone.token_ids:
            raise SystemExit("the default wrote other tokens than the target alone")
        if min(r.stats.prompt_tokens_reused for r in (alone, default)) < len(ids) - 1:
            raise SystemExit("the target did not keep the prompt's KV: this script measures decoding alone")
        rates = [1 / r.stats.time_per_output_token for r in (alone, default)]  # tokens/s after the first
        ratios.append(rates[1] / rates[0])
        st = default.stats
        print(f"pair {i + 1:2d} ({order[0]} first): the target alone {rates[0]:6.2f}, the default {rates[1]:6.2f} "
              f"tokens/s: {ratios[-1]:.2f}x; draft {st.draft_seconds:.2f} s, rounds of the target alone "
              f"{st.rounds_drafting_paused}/{st.rounds}", flush=True)
    print(f"the default: median {statistics.median(ratios):.3f}x the target alone ({min(ratios):.2f}x-"
          f"{max(ratios):.2f}x over {len(ratios)} pairs); outputs identical; verdict left: {pipe.guard_prior(key)}")


if __name__ == "__main__":
    main()
