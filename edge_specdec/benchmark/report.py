"""The rows benchmark's report: its figures per row (report.json), report.md and speedup.png."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

from .machine import machine_section
from .markdown import cell, problems_section, prompt_source_lines, row_problems, table
from .prompt_set import Prompt
from .report_files import pyplot, save_chart, write_report_files
from .setups import ENGINE_TITLES, Setup
from .stats import first_difference, median, rounded, spread, worst_median
from .verdict import speedup_verdict

MIB = 1024 * 1024

DEFINITIONS = """\
- tok/s: new tokens / wall seconds of one whole generate call (tokenizing, prefill, decoding, detokenizing), the
  same clock for every engine; median and spread over every prompt and repeat. Every run prefills its whole
  prompt: ours start from empty KV caches, GenAI's run with their prefix cache off.
- speedup: the median, over (prompt, repeat), of tok/s of the row / tok/s of the target alone of the same
  engine on the same prompt in the same repeat (the two ran back to back). Per category: the same median over
  that category's prompts. Where a row of ours drafted no token, it ran the target alone throughout and no ratio
  is shown; a median within the noise band (half the distance between the paired ratios' quartiles, or 10 %
  with fewer than 3) reads "no measurable difference".
- lowest prompt: the prompt whose paired ratios (one per repeat) have the lowest median, and that median: the
  row's floor. One slow run on a busy machine moves a median of two, so judge a floor with --repeats 4 or more.
- TTFT / TPOT: time to first token and time per output token after it, medians. Ours: the Pipeline's stats;
  GenAI: its perf metrics (get_ttft().mean, get_tpot().mean); transformers: a streamer's clock.
- acceptance: drafted tokens the target kept / drafted tokens, pooled over all runs (GenAI: as its extended
  perf metrics count them). tokens / target pass: new tokens / target forward passes (prefill included).
- peak RSS: the largest resident set size of the WHOLE benchmark process sampled every 20 ms during the row's
  runs: it includes every model loaded for every row (ours, GenAI, transformers), so compare the growth column
  (peak during a run minus the RSS when that run started) for what a row itself allocates.
- time split: our Pipeline's own clocks, summed over the timed runs: drafting, target passes (verification),
  and the rest of the loop (verification logic, bookkeeping, detokenizing).
- identical: greedy decoding must not change the output. Ours: the token ids equal those of ours-none for the same
  prompt; the peers: the text equals that of their own target alone. The target-alone rows compare their repeats
  with their first run.
- every row had one uncounted warm-up run first; within each (repeat, prompt) all rows ran back to back, the
  order rotated from one prompt to the next.
"""


def _paired_ratios(setup: Setup, base: Setup, keys=None) -> list[float]:
    return [run.tokens_per_s / base.runs[key].tokens_per_s for key, run in setup.runs.items()
            if key in base.runs and base.runs[key].tokens_per_s > 0 and (keys is None or key[0] in keys)]


def _identity(setup: Setup, base: Optional[Setup]) -> tuple[Optional[bool], list[dict], int]:
    """Compare every run with the baseline's first run on the same prompt."""
    if base is None:
        return None, [], 0
    by_ids = setup.spec.engine == "ours"
    reference = {}
    for (key, rep), run in sorted(base.runs.items(), key=lambda kv: kv[0][1]):
        reference.setdefault(key, run)
    mismatches, compared = [], 0
    for (key, rep), run in sorted(setup.runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        ref = reference.get(key)
        if ref is None or ref is run:
            continue
        compared += 1
        a, b = (run.token_ids, ref.token_ids) if by_ids else (run.text, ref.text)
        if a != b:
            d = first_difference(a, b)
            mismatches.append({"prompt": key, "repeat": rep, "first_difference": d, "length": len(a),
                               "reference_length": len(b), "got": repr(a[d:d + 8] if by_ids else a[d:d + 40]),
                               "reference": repr(b[d:d + 8] if by_ids else b[d:d + 40])})
    if not compared:
        return (True if setup is base and base.runs else None), [], 0
    return not mismatches, mismatches, compared


def summarize_setup(setup: Setup, setups: dict[str, Setup], prompts: list[Prompt]) -> dict[str, Any]:
    spec = setup.spec
    runs = list(setup.runs.values())
    base = setups.get(spec.baseline)
    tps = [r.tokens_per_s for r in runs]
    ratios = _paired_ratios(setup, base) if base is not None else []
    identical, mismatches, compared = _identity(setup, base)
    row: dict[str, Any] = {
        "setup": spec.name, "engine": spec.engine, "description": spec.description, "baseline": spec.baseline,
        "algorithm": spec.algorithm, "k": spec.k, "draft_policy": spec.policy if spec.engine == "ours" else None,
        "concurrent": spec.concurrent,
        "runs": len(runs), "failed_runs": len(setup.failures), "failures": setup.failures[:20],
        "new_tokens_total": sum(r.new_tokens for r in runs),
        "tokens_per_s": spread(tps),
        "speedup": median(ratios), "speedup_spread": spread(ratios), "speedup_verdict": None,
        "ttft_ms": median(r.ttft_ms for r in runs), "tpot_ms": median(r.tpot_ms for r in runs),
        "identical": identical, "identity_checked_runs": compared, "mismatches": mismatches[:20],
        "mismatched_runs": len(mismatches),
    }
    proposed = sum(r.proposed or 0 for r in runs)
    accepted = sum(r.accepted or 0 for r in runs)
    row["draft_tokens_proposed"], row["draft_tokens_accepted"] = (proposed, accepted) if proposed else (None, None)
    row["acceptance"] = accepted / proposed if proposed else None
    # our rows count what they drafted: one that drafted nothing ran the target alone, and its ratio is noise
    drafted = spec.engine != "ours" or bool(proposed)
    row["speedup_verdict"] = speedup_verdict(row["speedup"], drafted, ratios) if ratios else None
    passes = [r for r in runs if r.target_passes]
    row["mean_tokens_per_target_pass"] = (sum(r.new_tokens for r in passes) / sum(r.target_passes for r in passes)
                                          if passes else None)
    peaks = [r.rss_peak for r in runs if r.rss_peak]
    growth = [r.rss_peak - r.rss_start for r in runs if r.rss_peak and r.rss_start]
    row["peak_rss_mib"] = max(peaks) / MIB if peaks else None
    row["peak_rss_growth_mib"] = max(growth) / MIB if growth else None
    if spec.engine == "ours" and runs:
        split = {part: sum(getattr(r, f"{part}_seconds") or 0.0 for r in runs) for part in ("draft", "target", "loop")}
        row["time_split_seconds"] = split
        passes_total = sum(r.target_passes or 0 for r in runs)
        row["target_ms_per_pass"] = 1000 * split["target"] / passes_total if passes_total else None
        row["draft_ms_per_drafted_token"] = 1000 * split["draft"] / proposed if proposed else None
        rounds = sum(r.rounds or 0 for r in runs)
        row["mean_drafted_per_round"] = proposed / rounds if rounds and spec.algorithm != "none" else None
    else:
        row["time_split_seconds"] = None
    categories = list(dict.fromkeys(p.category for p in prompts))
    row["per_category"] = {}
    for category in categories:
        keys = {p.key for p in prompts if p.category == category}
        cat_runs = [r for (key, _), r in setup.runs.items() if key in keys]
        cat_ratios = _paired_ratios(setup, base, keys) if base is not None else []
        row["per_category"][category] = {
            "tokens_per_s": median(r.tokens_per_s for r in cat_runs), "speedup": median(cat_ratios),
            "speedup_verdict": speedup_verdict(median(cat_ratios), drafted, cat_ratios) if cat_ratios else None}
    row["per_prompt_tokens_per_s"] = {p.key: median(r.tokens_per_s for (key, _), r in setup.runs.items()
                                                    if key == p.key) for p in prompts}
    per_prompt = {p.key: _paired_ratios(setup, base, {p.key}) for p in prompts} if base is not None else {}
    row["per_prompt_speedup"] = {key: median(ratios) for key, ratios in per_prompt.items() if ratios}
    # the row's floor: a speed-up promise holds per prompt, not only for the median over all of them
    floor = worst_median(per_prompt) if drafted and setup is not base else None
    row["lowest_prompt"] = dict(zip(("prompt", "speedup"), floor)) if floor else None
    return row


def ours_vs_genai(setups: dict[str, Setup], ks: list[int], default_algorithm: str = "standard"
                  ) -> list[dict[str, Any]]:
    """Our rows against GenAI's, paired per run, for both GenAI variants: ours-none against genai-none;
    ours-standard-kK against genai-sd-kK and ours-standard-conf against genai-sd-conf (the same draft, the same
    setting); and our default row (ours-ALG-conf, ALG the bundle's default algorithm) against GenAI's fastest
    speculative row of the run (marked "fastest"), whatever its draft."""
    def ran(name: str) -> bool:
        return name in setups and bool(setups[name].runs)

    def median_tps(name: str) -> Optional[float]:
        return median(r.tokens_per_s for r in setups[name].runs.values())

    pairs = []
    for engine in ("genai", "genai-ours"):
        candidates = [("ours-none", f"{engine}-none")] + [(f"ours-standard-k{k}", f"{engine}-sd-k{k}") for k in ks]
        candidates.append(("ours-standard-conf", f"{engine}-sd-conf"))
        speculative = [n for n in setups if n.startswith(f"{engine}-sd-") and ran(n)]
        fastest = max(speculative, key=median_tps, default=None)
        if fastest is not None and (f"ours-{default_algorithm}-conf", fastest) not in candidates:
            candidates.append((f"ours-{default_algorithm}-conf", fastest))
        for ours, peer in candidates:
            if ran(ours) and ran(peer):
                pairs.append({"ours": ours, "genai": peer, "genai_fastest": peer == fastest,
                              "ours_tokens_per_s": median_tps(ours), "genai_tokens_per_s": median_tps(peer),
                              "ratio": median(_paired_ratios(setups[ours], setups[peer]))})
    return pairs


def build_report(setups: list[Setup], prompts: list[Prompt], settings: dict, machine: dict, manifest: dict,
                 skipped: list[dict], notes: list[str], command: Optional[str]) -> dict[str, Any]:
    by_name = {s.name: s for s in setups}
    rows = [summarize_setup(s, by_name, prompts) for s in setups]
    bundle = {"path": settings["bundle"], "relation": settings["relation"]}
    for side in ("target", "draft"):
        info = manifest.get(side)
        if info:
            bundle[side] = {"source": info.get("source", {}).get("given"), "architecture": info.get("architecture"),
                            "weights": info.get("weights", {}).get("format"),
                            "parameters": info.get("num_parameters")}
    report = {
        "tool": "edge-specdec bench", "command": command, "settings": settings, "machine": machine, "bundle": bundle,
        "categories": settings["categories"],
        "prompts": [{"key": p.key, "category": p.category, "chars": len(p.text)} for p in prompts],
        "setups": rows, "skipped": skipped, "notes": notes,
        "ours_vs_genai": ours_vs_genai(by_name, settings["ks"], settings.get("default_algorithm") or "standard"),
        "not_identical": [r["setup"] for r in rows if r["identical"] is False],
    }
    return rounded(report, 4)


# --- Markdown ---------------------------------------------------------------------------------------------------

def _lowest_cell(row: dict) -> str:
    lowest = row.get("lowest_prompt")
    return f"{lowest['speedup']:.2f}x ({lowest['prompt']})" if lowest else "-"


def _identity_cell(row: dict) -> str:
    if row["setup"] == row["baseline"]:  # the reference itself: its repeats are compared with its first run
        if not row["identity_checked_runs"]:
            return "reference" if row["runs"] else "no runs"
        return ("reference; repeats identical" if row["identical"]
                else f"reference; **repeats differ** ({row['mismatched_runs']} runs)")
    if row["identical"] is None:
        return "not checked" if not row["runs"] else "no reference"
    if row["identical"]:
        return f"yes ({row['identity_checked_runs']} runs)" if row["identity_checked_runs"] else "yes"
    return f"**NO** ({row['mismatched_runs']} of {row['identity_checked_runs']} runs)"


def render_markdown(report: dict) -> str:
    s, m, b = report["settings"], report["machine"], report["bundle"]
    rows = report["setups"]
    name = Path(s["bundle"]).name
    lines = [f"# edge-specdec bench: {name}", ""]
    if report.get("command"):
        lines += ["```", report["command"], "```", ""]
    sides = "; ".join(f"{side} {b[side]['source']} ({b[side]['weights']})" for side in ("target", "draft") if side in b)
    lines += [f"Bundle `{s['bundle']}`: {sides}; vocabulary {s['relation']}.",
              f"{s['max_new_tokens']} new tokens at most, greedy, {s['repeats']} repeat(s) of "
              f"{len(report['prompts'])} prompts in {len(s['categories'])} "
              f"categor{'y' if len(s['categories']) == 1 else 'ies'} ({s['prompt_format']}); "
              f"draft lengths K = {', '.join(map(str, s['ks']))}; our precision {s['precision']}, "
              f"KV rollback {s['target_rollback']}; "
              + (f"our draft's output layer cut to {s['draft_output_ids']} token ids (--draft-vocab); "
                 if s.get("draft_output_ids") else "")
              + f"{s['placement']}.", ""]
    lines += prompt_source_lines(s)
    if s.get("interrupted"):
        lines += ["**Interrupted**: the figures cover only the runs done before Ctrl-C.", ""]

    lines += ["## Speed", ""]
    lines += table(
        ["setup", "runs", "tok/s median", "tok/s IQR", "tok/s min-max", "speedup vs its target alone", "TTFT ms",
         "TPOT ms", "acceptance", "tokens / target pass", "lowest prompt", "identical to its target alone"],
        [[r["setup"], str(r["runs"]) + (f" ({r['failed_runs']} failed)" if r["failed_runs"] else ""),
          cell((r["tokens_per_s"] or {}).get("median")),
          f"{r['tokens_per_s']['p25']:.2f}-{r['tokens_per_s']['p75']:.2f}" if r["tokens_per_s"] else "-",
          f"{r['tokens_per_s']['min']:.2f}-{r['tokens_per_s']['max']:.2f}" if r["tokens_per_s"] else "-",
          "baseline" if r["setup"] == r["baseline"] else r["speedup_verdict"] or "-",
          cell(r["ttft_ms"], ".1f"), cell(r["tpot_ms"], ".1f"), cell(r["acceptance"], ".3f"),
          cell(r["mean_tokens_per_target_pass"]), _lowest_cell(r), _identity_cell(r)] for r in rows])

    lines += ["", "## Memory and time split", "",
              "Peak RSS is that of the whole process (every model loaded for every row); growth is the peak during a "
              "run minus the RSS when the run started. Time split: our Pipeline's clocks, summed over the timed runs.",
              ""]
    lines += table(
        ["setup", "peak RSS MiB (whole process)", "RSS growth in a run MiB", "draft s", "target s", "loop s",
         "target ms / pass", "draft ms / drafted token", "drafted tokens / round"],
        [[r["setup"], cell(r["peak_rss_mib"], ".0f"), cell(r["peak_rss_growth_mib"], ".1f"),
          *((cell(r["time_split_seconds"]["draft"]), cell(r["time_split_seconds"]["target"]),
             cell(r["time_split_seconds"]["loop"])) if r["time_split_seconds"] else ("-", "-", "-")),
          cell(r.get("target_ms_per_pass"), ".1f"), cell(r.get("draft_ms_per_drafted_token"), ".1f"),
          cell(r.get("mean_drafted_per_round"))] for r in rows])

    categories = s["categories"]
    lines += ["", "## Speedup over the target alone of the same engine, per prompt category", "",
              "Target-alone rows show their median tok/s.", ""]
    per_category = []
    for r in rows:
        if r["setup"] == r["baseline"]:
            cells = [cell(r["per_category"][c]["tokens_per_s"], ".1f", " tok/s") for c in categories]
            cells.append(cell((r["tokens_per_s"] or {}).get("median"), ".1f", " tok/s"))
        else:
            cells = [r["per_category"][c]["speedup_verdict"] or "-" for c in categories]
            cells.append(r["speedup_verdict"] or "-")
        per_category.append([r["setup"], *cells])
    lines += table(["setup", *categories, "all"], per_category)

    if report["ours_vs_genai"]:
        lines += ["", "## Ours against OpenVINO GenAI", "",
                  "ratio: median over (prompt, repeat) of tok/s ours / tok/s GenAI, paired runs. \"fastest\": "
                  "GenAI's fastest speculative row in this run.", ""]
        lines += table(["ours", "GenAI", "ours tok/s", "GenAI tok/s", "ratio"],
                       [[p["ours"], p["genai"] + (" (fastest)" if p.get("genai_fastest") else ""),
                         cell(p["ours_tokens_per_s"]), cell(p["genai_tokens_per_s"]),
                         cell(p["ratio"], ".2f", "x")] for p in report["ours_vs_genai"]])

    problems = [line for r in rows for line in row_problems(r, r["setup"])]
    lines += problems_section(problems, report)

    engines = list(dict.fromkeys(r["engine"] for r in rows))
    lines += ["", "## Setups", ""] + [f"- `{r['setup']}`: {r['description']}" for r in rows]
    lines += ["- engines: " + "; ".join(f"{e} = {ENGINE_TITLES[e]}" for e in engines)]
    lines += ["", "## Definitions", "", DEFINITIONS.rstrip()]
    lines += machine_section(m)
    return "\n".join(lines)


# --- the files --------------------------------------------------------------------------------------------------

def plot_speedups(report: dict, path: Path) -> None:
    """Grouped bars: per prompt category (and all), one bar per row, its speedup over its engine's target alone."""
    plt = pyplot()
    rows = [r for r in report["setups"] if r["setup"] != r["baseline"] and r["runs"]]
    groups = list(report["settings"]["categories"]) + ["all"]
    width = 0.8 / max(1, len(rows))
    fig, ax = plt.subplots(figsize=(min(24.0, 4 + len(groups) * (0.22 * len(rows) + 0.6)), 5.5))
    colors = plt.get_cmap("tab20" if len(rows) > 10 else "tab10")
    for i, r in enumerate(rows):
        values = [r["per_category"][g]["speedup"] if g != "all" else r["speedup"] for g in groups]
        xs = [j + (i - (len(rows) - 1) / 2) * width for j in range(len(groups))]
        ax.bar(xs, [v if v is not None else 0.0 for v in values], width, label=r["setup"], color=colors(i % 20))
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--")
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([g.replace("_", "\n") for g in groups])
    ax.set_ylabel("speedup vs the target alone (same engine)")
    s = report["settings"]
    ax.set_title(f"{Path(s['bundle']).name}: {s['max_new_tokens']} tokens, greedy, {s['repeats']} repeat(s)")
    if rows:
        ax.legend(fontsize="small", ncol=min(4, len(rows)), loc="upper center", bbox_to_anchor=(0.5, -0.15))
    save_chart(fig, path)


def write_report(report: dict, out_dir: Path, plot: bool = True,
                 say: Callable[[str], None] = print) -> dict[str, str]:
    """report.json, report.md and, with matplotlib, speedup.png in out_dir."""
    return write_report_files(report, out_dir, render_markdown, plot_speedups, "speedup.png", plot, say)
