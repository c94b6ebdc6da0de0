"""How close `edge-specdec pair`'s predictions come to measured runs.

Takes the report `edge-specdec pair ... --json` wrote and, for each simulated candidate, the bundle it becomes,
then measures each candidate as `edge-specdec run --compare` does (its default settings: the drafting guard, the
clock, free drafts first; one untimed run of each first) on the same prompts, interleaved: in each repeat every
prompt runs the target alone and then each candidate, in an order that rotates per repeat. A candidate's figure in
one repeat is the mean over the prompts of the target alone's seconds per output token over its own (the figure
`pair` predicts); its measurement is the median over the repeats, its spread their range.

    edge-specdec pair BUNDLE DRAFT_BUNDLE... --top 3 --json > pair.json
    python benchmarks/pair_accuracy.py pair.json --bundle "NAME=DRAFT_BUNDLE" ... --repeats 5

A candidate without a draft model runs on the first bundle given ("no draft" is the baseline itself, 1.0 by
definition; "free drafts only" runs `suffix`). Prints one line per candidate: predicted, measured median and
range, the prediction's error, and whether the predicted order matches the measured one (ties: measured ranges
that overlap).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

from edge_specdec.pairing import PROMPTS_FILE, read_prompts
from edge_specdec.runtime import Engine

NO_DRAFT, FREE = "no draft", "free drafts only"


def prompts_of(report: dict, prompts_file: str | None) -> list[str]:
    if report["task"] == "file":
        if not prompts_file:
            sys.exit("the report's prompts came from a file: give it with --prompts")
        return list(read_prompts(prompts_file))
    return json.loads(PROMPTS_FILE.read_text(encoding="utf-8"))[report["task"]]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("report", help="the JSON `edge-specdec pair --json` printed")
    p.add_argument("--bundle", action="append", default=[], metavar="NAME=PATH",
                   help="the bundle a candidate becomes (its name as in the report); the first also runs the "
                        "candidates without a draft model")
    p.add_argument("--prompts", help="the prompts file the report used (--prompts of pair)")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()

    report = json.loads(Path(args.report).read_text())
    bundles = dict(b.split("=", 1) for b in args.bundle)
    if not bundles:
        sys.exit("give each simulated candidate's bundle with --bundle NAME=PATH")
    prompts = prompts_of(report, args.prompts)
    predicted = {c["name"]: c["prediction"]["speedup"] for c in report["candidates"] if c.get("prediction")}
    missing = [n for n in predicted if n not in bundles and n not in (NO_DRAFT, FREE)]
    if missing:
        sys.exit(f"no --bundle for {', '.join(missing)}")

    first = Engine(next(iter(bundles.values())))
    engines = {NO_DRAFT: (first, "none"), FREE: (first, "suffix")}
    engines.update({n: (first if path == next(iter(bundles.values())) else Engine(path), "auto")
                    for n, path in bundles.items() if n in predicted})
    rows = [n for n in predicted if n in engines]
    config = dataclasses.replace(first.default_config, max_new_tokens=report["max_new_tokens"], temperature=0)
    if config.eos_token_ids is None:
        config = dataclasses.replace(config, eos_token_ids=first.bundle.target.eos_token_ids)
    if report["task"] == "chat" and first.chat_template is not None:
        prompts = [first.chat_prompt([{"role": "user", "content": text}]) for text in prompts]

    def seconds_per_token(name: str, prompt) -> tuple[float, list[int]]:
        engine, algorithm = engines[name]
        engine.forget()  # no run copies another's answer from the pool
        start = time.perf_counter()
        result = engine.session().generate(prompt, config, algorithm=algorithm)
        return (time.perf_counter() - start) / max(1, len(result.token_ids)), list(result.token_ids)

    for name in rows:  # one untimed run of each, as run --compare does
        seconds_per_token(name, prompts[0])
    figures = {name: [] for name in rows}
    for repeat in range(args.repeats):
        order = rows[repeat % len(rows):] + rows[:repeat % len(rows)]
        ratios = {name: [] for name in rows}
        for prompt in prompts:
            timed = {name: seconds_per_token(name, prompt) for name in order}
            alone, reference = timed[NO_DRAFT]
            for name in rows:
                if timed[name][1] != reference:
                    sys.exit(f"{name}'s output differs from the target alone's: not lossless")
                ratios[name].append(alone / timed[name][0])
        for name in rows:
            figures[name].append(statistics.mean(ratios[name]))
        print(f"repeat {repeat + 1}: " + ", ".join(f"{n} {figures[n][-1]:.3f}" for n in rows), file=sys.stderr)

    measured = {n: statistics.median(v) for n, v in figures.items()}
    print(f"| candidate | predicted | measured (median of {args.repeats}) | range | error |")
    print("|---|---|---|---|---|")
    for name in sorted(rows, key=lambda n: -measured[n]):
        error = predicted[name] / measured[name] - 1
        print(f"| {name} | {predicted[name]:.3f} | {measured[name]:.3f} | {min(figures[name]):.3f}-"
              f"{max(figures[name]):.3f} | {error:+.1%} |")
    by_prediction = sorted(rows, key=lambda n: -predicted[n])
    by_measure = sorted(rows, key=lambda n: -measured[n])
    swapped = [(a, b) for i, a in enumerate(by_prediction) for b in by_prediction[i + 1:]
               if measured[a] < measured[b] and max(figures[a]) < min(figures[b])]
    print(f"\npredicted order: {' > '.join(by_prediction)}\nmeasured order:  {' > '.join(by_measure)}")
    print("order: " + ("the same, up to candidates whose measured ranges overlap (ties)" if not swapped else
                       "DIFFERENT where the ranges do not overlap: " + "; ".join(f"{a} below {b}" for a, b in swapped)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
