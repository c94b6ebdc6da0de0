"""The default after a long prompt from an empty drafting-guard verdict, as at a user's first long prompts, and then
with the verdict that run left, against the target alone on the same engine, with every target call printed.

    python benchmarks/guard_cold_runs.py BUNDLE [--length 8192] [--task summarize] [--rounds 2]

The engine opens as `edge-specdec bench long-prompts` opens it (its defaults, as the Python API and serve open it;
no prefix reuse, no draft pool), and every run prefills the suite's prompt of --length tokens afresh. Each round
runs the target alone, the default with the guard's verdict for the prompt's kind of request emptied, and the
default with the verdict that run left. Printed per run: tokens/s after the first token and its ratio to the
round's run of the target alone, the draft's seconds, the rounds the guard ran the target alone, each target call
after the prefill as tokens@past:milliseconds, and the verdict the run left. What it shows: how far one call's time
moves within a run on this machine, against the margins the guard decides on. The outputs are checked equal to the
target alone's. Like any run of the default, it leaves its verdicts in the engine's measurement cache.
"""
from __future__ import annotations

import argparse

from edge_specdec.benchmark.suites.long_prompts import add_one_prompt_arguments, one_prompt


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n    python")[0])
    add_one_prompt_arguments(p)
    p.add_argument("--rounds", type=int, default=2, help="rounds of the three runs")
    args = p.parse_args()
    pipe, ids, config = one_prompt(args)
    pipe.compile_static_copies()  # no copy compiles inside a timed run
    key = pipe.default_guard_key(config, len(ids))

    def run(algorithm: str, alone_rate: float = 0.0, expected=None):
        pipe.draft.reset()
        result = pipe.generate(ids, config, algorithm=algorithm, record_target_calls=True)
        if expected is not None and result.token_ids != expected:
            raise SystemExit("the default wrote other tokens than the target alone")
        st = result.stats
        rate = 1 / st.time_per_output_token  # tokens/s after the first
        versus = f" ({rate / alone_rate:.2f}x the target alone)" if alone_rate else ""
        print(f"  {rate:6.2f} tokens/s after the first{versus}, draft {st.draft_seconds:.2f} s, "
              f"rounds of the target alone {st.rounds_drafting_paused}/{st.rounds}", flush=True)
        print("   ", " ".join(f"{c.tokens}@{c.past}:{c.seconds * 1e3:.0f}" for c in st.target_calls[1:]), flush=True)
        return rate, result.token_ids

    run("none")  # uncounted: the first run of each size pays the plugin's preparations
    for round_ in range(args.rounds):
        print(f"round {round_ + 1}: the target alone", flush=True)
        alone, expected = run("none")
        for kind, emptied in (("an emptied verdict", True), ("the verdict the run before left", False)):
            if emptied:
                pipe.measurements.put(pipe.guard_name(key), None, write=False)
            print(f"round {round_ + 1}: the default from {kind}", flush=True)
            run("auto", alone, expected)
            print(f"    verdict left: {pipe.guard_prior(key)}", flush=True)


if __name__ == "__main__":
    main()
