"""The default after a long prompt where the drafting guard's verdict is for the target alone, against the target
alone on the same engine.

    python benchmarks/guard_paused_runs.py BUNDLE [--length 8192] [--task summarize] [--pairs 4]

The engine opens as `edge-specdec bench long-prompts` opens it (its defaults, as the Python API and serve open it;
no prefix reuse, no draft pool), and every run prefills the suite's prompt of --length tokens afresh. Before each
run of the default, the guard's verdict for the prompt's kind of request is set to the target alone, either with
its countdown to the next check of drafting far off ("paused": no check in the run) or run out ("check": the run
measures drafting at once, which starts with the draft's prefill of its window). Each pair runs the target alone
and a default run back to back, alternating which goes first, the paused and checking runs in turn; printed per
run: tokens/s after the first token, the median target pass, the draft's seconds; then each kind's ratios to the
target alone of its pair and their median. The outputs are checked equal to the target alone's.
"""
from __future__ import annotations

import argparse
import statistics

from edge_specdec.benchmark.suites.long_prompts import add_one_prompt_arguments, one_prompt

# a verdict for the target alone, as runs that found drafting losing leave it; "left" is set per run
ALONE = {"mode": False, "interval": 256, "lost": 6, "drafting": [10.0, 1.0], "alone": [12.0, 1.0]}
LEFT = {"paused": 128, "check": 0}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n    python")[0])
    add_one_prompt_arguments(p)
    p.add_argument("--pairs", type=int, default=4, help="pairs per kind of default run")
    args = p.parse_args()
    pipe, ids, config = one_prompt(args)
    name = pipe.guard_name(pipe.default_guard_key(config, len(ids)))

    def run(kind: str):
        if kind != "alone":
            pipe.measurements.put(name, {**ALONE, "left": LEFT[kind]}, write=False)
        pipe.draft.reset()
        result = pipe.generate(ids, config, algorithm="none" if kind == "alone" else "auto", record_target_calls=True)
        st = result.stats
        rate = 1 / st.time_per_output_token  # tokens/s after the first
        passes = statistics.median(c.seconds for c in st.target_calls[1:])
        print(f"{kind:7s} {rate:6.2f} tokens/s after the first, target pass {passes * 1e3:6.1f} ms, draft "
              f"{st.draft_seconds:.2f} s, rounds paused {st.rounds_drafting_paused}/{st.rounds}", flush=True)
        return rate, result.token_ids

    run("alone")  # uncounted: the first run of each size pays the plugin's preparations
    ratios: dict[str, list[float]] = {kind: [] for kind in LEFT}
    for i in range(args.pairs * len(LEFT)):
        kind = list(LEFT)[i % len(LEFT)]
        order = ("alone", kind) if i % 2 else (kind, "alone")
        got = dict(zip(order, (run(k) for k in order)))
        if got[kind][1] != got["alone"][1]:
            raise SystemExit(f"a {kind} run wrote other tokens than the target alone")
        ratios[kind].append(got[kind][0] / got["alone"][0])
    for kind, values in ratios.items():
        print(f"{kind}: {', '.join(f'{v:.2f}x' for v in sorted(values))} the target alone (median "
              f"{statistics.median(values):.2f}x); outputs identical")


if __name__ == "__main__":
    main()
