"""The clients benchmark's report: report.md (the goals, the summary, a table per number of clients, the
definitions), report.json and clients.png, aggregate tokens/s and TPOT against the number of clients."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from .client_summary import GOAL_CLIENTS
from .machine import machine_section
from .markdown import cell, problems_section, prompt_source_lines, row_problems, table
from .report_files import pyplot, save_chart, write_report_files

DEFINITIONS = """\
- aggregate tok/s: all clients' new tokens / wall seconds of the round, from the moment every client sent its
  request to the last token of the last client; the median over repeats. Sequential rows: the N requests one
  after another, wall = their sum.
- client tok/s: a client's new tokens / its seconds from the round's start to its last token (sequential rows:
  from its own start); the median over clients and repeats.
- TTFT: time to the first token, from the round's start (concurrent rows) or from the request's own start
  (sequential rows: the wait for the requests before it is in the wall time, not here). TPOT: time per output
  token after the first. Medians over clients and repeats; TPOT max: the worst client.
  Ours: the session's own clocks. GenAI: our clock, read after every step() of the pipeline (when GenAI hands
  out new tokens), so a first token counts at the end of the step that made it; GenAI's own per-request perf
  metrics (GenerationHandle.get_perf_metrics) are in report.json beside them.
- identical: greedy decoding must not change the output. Ours: each request's token ids equal those of the same
  prompt served alone by our target alone (ours-none-sequential, its first timed run; its own later runs are
  checked against that too). GenAI: token ids against genai-cb-none's first run of the same prompt (GenAI
  against its own target alone, as the other bench rows compare GenAI); "= ours target alone": GenAI's ids
  against ours-none-sequential, a final EOS aside (GenAI runs with other CPU properties, so differences there
  are expected and are not a fault of either).
- batched calls: our rows at once, on a batching engine: the model calls (target and draft) that ran several
  sessions' blocks together, summed over the repeats, and the mean number of blocks in one; "-": not batching.
- ratios: medians over repeats of paired ratios (two rows with the same clients in the same repeat). TPOT vs
  alone: each client's TPOT in ours-spec / the same request's TPOT in ours-spec-sequential of the same repeat
  (there each request is served alone).
- every (clients, row) had one uncounted warm-up round first; within a repeat and a number of clients, all
  rows ran back to back, the order rotated from one to the next.
"""


def _clients(n: int) -> str:
    return f"{n} client{'s' if n != 1 else ''}"


def _identity_cell(row: dict) -> str:
    is_reference = row["setup"] == row["identity_reference"]
    if row["identical"] is None:  # nothing compared: no runs, or only the reference's own first runs
        return "no runs" if not row["rounds"] else "the reference" if is_reference else "no reference"
    ref = " (the reference: against its own first run)" if is_reference else ""
    if row["identical"]:
        return f"yes, {row['identity_checked_requests']}/{row['identity_checked_requests']}{ref}"
    return f"**NO**, {row['mismatched_requests']} of {row['identity_checked_requests']} differ{ref}"


def render_clients_markdown(report: dict) -> str:
    s, m, b = report["settings"], report["machine"], report["bundle"]
    lines = [f"# edge-specdec bench clients: {Path(s['bundle']).name}", ""]
    if report.get("command"):
        lines += ["```", report["command"], "```", ""]
    sides = "; ".join(f"{side} {b[side]['source']} ({b[side]['weights']})" for side in ("target", "draft") if side in b)
    g = s.get("genai") or {}
    lines += [f"Bundle `{s['bundle']}`: {sides}; vocabulary {s['relation']}. Clients: "
              f"{', '.join(map(str, s['clients']))}; {s['max_new_tokens']} new tokens at most, greedy, "
              f"{s['repeats']} repeat(s); {len(report['prompts'])} distinct prompts ({s['prompt_format']}), "
              f"N clients send the first N. Ours: one Engine("
              f"{'batching=True' if s['batching'] else 'without a batching option'})"
              + (f" ({s['batching_note']})" if s.get("batching_note") else "")
              + f", a session per client, algorithm auto = {s['algorithms']['auto']}, precision {s['precision']}; "
              f"{s['placement']}."
              + (f" GenAI {g['version']}, continuous batching, prefix cache off, its default CPU properties; its "
                 f"speculative row: {g['draft_from']} ({g['assistant']})." if g.get("version") else ""), ""]
    lines += prompt_source_lines(s)
    if s.get("interrupted"):
        lines += ["**Interrupted**: the figures cover only the rounds done before Ctrl-C.", ""]
    if report.get("goals"):
        lines += [f"## Goals at {GOAL_CLIENTS} clients", ""]
        lines += table(["goal", "measured", "met"],
                       [[x["goal"], x["shown"], {True: "yes", False: "**no**", None: "-"}[x["met"]]]
                        for x in report["goals"]])
        lines.append("")
    lines += ["## Summary", "",
              "Aggregate tokens/s ratios (paired per repeat) and ours-spec's time per output token.", ""]

    def ratio(value) -> str:
        return cell(value, ".2f", "x")
    lines += table(["clients", "ours-spec / one after another", "ours-spec / ours-none", "ours-spec / genai-cb-sd",
                    "ours-none / genai-cb-none", "ours-spec TPOT vs alone (median, worst)",
                    "ours-spec TPOT vs 1 client"],
                   [[str(x["clients"]), ratio(x["spec_vs_sequential"]), ratio(x["spec_vs_ours_none"]),
                     ratio(x["spec_vs_genai_cb_sd"]), ratio(x["ours_none_vs_genai_cb_none"]),
                     f"{ratio(x['spec_tpot_vs_alone_median'])}, {ratio(x['spec_tpot_vs_alone_max'])}",
                     ratio(x["spec_tpot_vs_one_client"])] for x in report["summary"]])
    for res in report["results"]:
        lines += ["", f"## {_clients(res['clients'])}", ""]
        lines += table(
            ["setup", "rounds", "aggregate tok/s", "wall s", "client tok/s", "TTFT ms", "TPOT ms", "TPOT max ms",
             "acceptance", "batched calls (blocks / call)", "identical to the target alone",
             "GenAI = ours target alone"],
            [[r["setup"], str(r["rounds"]) + (f" ({r['failed_rounds']} failed)" if r["failed_rounds"] else ""),
              cell((r["aggregate_tokens_per_s"] or {}).get("median")), cell(r["wall_seconds"]),
              cell(r["client_tokens_per_s"]), cell(r["ttft_ms"], ".0f"), cell(r["tpot_ms"], ".1f"),
              cell(r["tpot_ms_max"], ".1f"), cell(r["acceptance"], ".3f"),
              "-" if r.get("batched_calls") is None else
              f"{r['batched_calls']}" + (f" ({r['sequences_per_batched_call']:.2f})" if r["batched_calls"] else ""),
              _identity_cell(r),
              "-" if r.get("identical_to_ours_target_alone") is None
              else f"yes, {r['checked_against_ours']}/{r['checked_against_ours']}"
              if r["identical_to_ours_target_alone"]
              else f"no, {r['differing_from_ours']} of {r['checked_against_ours']} differ"]
             for r in res["rows"]])
    problems = [line for res in report["results"] for r in res["rows"]
                for line in row_problems(r, f"{r['setup']} with {_clients(r['clients'])}")]
    lines += problems_section(problems, report)
    lines += ["", "## What GenAI gives per request, and what not", "",
              "- TTFT and TPOT: per request, from our clock read after every step() (GenAI hands out tokens only "
              "between steps, so a token is timed at the end of the step that made it) and from GenAI's own "
              "GenerationHandle.get_perf_metrics(), both in report.json; "
              + (f"the two differ by at most {report['genai_clock_difference_ms']:.1f} ms in this run."
                 if report.get("genai_clock_difference_ms") is not None else "no GenAI request ran."),
              "- acceptance and tokens per target pass: GenAI counts draft tokens for a whole generate() call "
              "(its extended perf metrics), not per GenerationHandle, so genai-cb-sd has no acceptance here.",
              "- batched calls: GenAI batches every scheduled request in each step; it has no count comparable "
              "to ours.", ""]
    lines += ["## Setups", ""] + [f"- `{x['setup']}`: {x['description']}" for x in report["setups"]]
    lines += ["", "## Prompts", "", ", ".join(f"{p['key']} ({p['tokens']} tokens)" for p in report["prompts"])]
    lines += ["", "## Definitions", "", DEFINITIONS.rstrip()]
    lines += machine_section(m)
    return "\n".join(lines)


def plot_clients(report: dict, path: Path) -> None:
    """Aggregate tokens/s and median TPOT against the number of clients, one line per row."""
    plt = pyplot()
    clients = report["settings"]["clients"]
    names = [x["setup"] for x in report["setups"]]
    series = {name: {res["clients"]: r for res in report["results"] for r in res["rows"] if r["setup"] == name}
              for name in names}
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5))
    style = {"ours-spec": ("tab:red", "-"), "ours-none": ("tab:blue", "-"), "ours-spec-sequential": ("tab:red", ":"),
             "ours-none-sequential": ("tab:blue", ":"), "genai-cb-sd": ("tab:green", "--"),
             "genai-cb-none": ("tab:gray", "--")}
    for name in names:
        xs = [n for n in clients if (series[name].get(n) or {}).get("aggregate_tokens_per_s")]
        if not xs:
            continue
        color, line = style.get(name, (None, "-"))
        left.plot(xs, [series[name][n]["aggregate_tokens_per_s"]["median"] for n in xs], marker="o", color=color,
                  linestyle=line, label=name)
        tx = [n for n in xs if series[name][n]["tpot_ms"] is not None]
        right.plot(tx, [series[name][n]["tpot_ms"] for n in tx], marker="o", color=color, linestyle=line,
                   label=name)
    for ax, label in ((left, "aggregate tokens/s (all clients)"), (right, "time per output token, ms (median client)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(clients)
        ax.set_xticklabels([str(n) for n in clients])
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
    left.legend(fontsize="small")
    s = report["settings"]
    fig.suptitle(f"{Path(s['bundle']).name}: {s['max_new_tokens']} tokens per client, greedy, "
                 f"{s['repeats']} repeat(s)")
    save_chart(fig, path)


def write_clients_report(report: dict, out_dir: Path, plot: bool = True,
                         say: Callable[[str], None] = print) -> dict[str, str]:
    return write_report_files(report, out_dir, render_clients_markdown, plot_clients, "clients.png", plot, say)

