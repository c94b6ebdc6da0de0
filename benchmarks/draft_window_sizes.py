"""The draft's window after a long prompt: what each size costs and what the draft keeps.

    python benchmarks/draft_window_sizes.py BUNDLE [--length 4096] [--tasks summarize quote]
        [--windows 128 256 512 1024] [--repeats 2] [--max-new-tokens 64]

The long-prompts suite's prompts (`edge-specdec bench long-prompts`: a document of LENGTH tokens, then "summarize
it" or "quote a function from it"), on one engine opened with its defaults, as the Python API and serve open it (static
copies of a small draft among them), whose target keeps the prompt's KV between runs, so that a run costs its
answer, not the prompt's prefill again. The draft's cache is emptied before every run: each run pays the
draft's prefill of its window, as a new long prompt does. Per repeat the target alone runs first, then the default
algorithm at each window size, the order rotating from repeat to repeat, with the drafting guard off, so that every
row drafts and shows what drafting costs at that size: tokens/s of the whole run against the target alone's in the
same repeat, the share of drafted tokens the target kept, the draft's seconds and the target's, and the bound the
target's passes set: the target alone's seconds over the row's target seconds, the speedup the row would have if
its draft cost nothing. The outputs are checked equal to the target alone's. Prints a markdown table of medians.
"""
from __future__ import annotations

import argparse
import statistics

from edge_specdec.benchmark.suites.long_prompts import TASKS, suite_prompts
from edge_specdec.runtime import GenerationConfig, Pipeline


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n    python")[0])
    p.add_argument("bundle", help="a bundle folder with a draft model")
    p.add_argument("--length", type=int, default=4096, help="prompt tokens (default 4096)")
    p.add_argument("--tasks", nargs="+", choices=sorted(TASKS), default=["summarize", "quote"])
    p.add_argument("--windows", type=int, nargs="+", default=[128, 256, 512, 1024])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=64)
    args = p.parse_args()
    pipe = Pipeline(args.bundle, draft_pool_tokens=0)
    prompts = suite_prompts(pipe, [args.length], args.tasks)
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, temperature=0, ignore_eos=True)
    print("| task | window | tokens/s vs the target alone | drafted tokens kept | draft s per run | target s per run "
          "| the draft at no cost | identical |")
    print("|---|---|---|---|---|---|---|---|")
    for task in args.tasks:
        ids = prompts[f"{args.length}/{task}"]
        pipe.generate(ids, config, algorithm="none")  # the prompt's prefill, uncounted: later runs reuse it
        pipe.generate(ids, config, algorithm="auto", guard=False)  # uncounted: compiles the draft's static copies
        rows: dict[int, list[tuple[float, float, float, float, float, bool]]] = {w: [] for w in args.windows}
        for repeat in range(args.repeats):
            alone = pipe.generate(ids, config, algorithm="none")
            base = len(alone.token_ids) / alone.stats.seconds
            turn = repeat % len(args.windows)
            for window in args.windows[turn:] + args.windows[:turn]:
                pipe.draft.reset()
                r = pipe.generate(ids, config, algorithm="auto", draft_window=window, guard=False)
                st = r.stats
                kept = st.draft_tokens_accepted / st.draft_tokens_proposed if st.draft_tokens_proposed else 0.0
                rows[window].append((len(r.token_ids) / st.seconds / base, kept, st.draft_seconds, st.target_seconds,
                                     alone.stats.seconds / st.target_seconds, r.token_ids == alone.token_ids))
            print(f"  {task} repeat {repeat + 1}/{args.repeats} done", flush=True)
        for window, runs in rows.items():
            ratio, kept, draft_s, target_s, bound = (statistics.median(x[i] for x in runs) for i in range(5))
            print(f"| {task} | {window} | {ratio:.2f}x | {kept:.2f} | {draft_s:.2f} | {target_s:.2f} | {bound:.2f}x | "
                  f"{sum(x[5] for x in runs)}/{len(runs)} |", flush=True)


if __name__ == "__main__":
    main()
