"""The rows benchmark: load the rows, run them interleaved, and hand the measurements to the report."""
from __future__ import annotations

import dataclasses
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

from ..errors import EdgeSpecdecError
from .genai_draft import load_genai_draft
from .interleave import run_interleaved
from .machine import machine_info, note_load_at_end
from .prompt_set import Prompt, load_prompt_set, pick_categories, prompt_source, render_prompts
from .setups import (Run, Setup, Spec, candidate_specs, genai_runner, hf_runner, load_genai, load_hf, ours_runner,
                     select_specs)

DEFAULT_KS = (3, 5)


# --- memory -----------------------------------------------------------------------------------------------------

def read_rss() -> Optional[int]:
    """This process's resident set size in bytes (Linux /proc/self/statm), or None elsewhere."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class RssSampler:
    """A background thread that samples the whole process's RSS; window() gives the peak during one run."""

    def __init__(self, interval: float = 0.02):
        self.interval = interval
        self.peak: Optional[int] = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)
        self.available = read_rss() is not None
        if self.available:
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            rss = read_rss()
            if rss is not None and self.peak is not None and rss > self.peak:
                self.peak = rss

    def start_window(self) -> Optional[int]:
        self.peak = read_rss()
        return self.peak

    def end_window(self) -> Optional[int]:
        rss = read_rss()
        peak, self.peak = self.peak, None
        return max(p for p in (peak, rss) if p is not None) if (peak or rss) else None

    def close(self) -> None:
        self._stop.set()


# --- the run ----------------------------------------------------------------------------------------------------

def same_target(bundle, other) -> bool:
    """Whether two bundles hold the same target weights (by the checksums in their manifests; the IR's XML is not
    compared, since two exports of one model name its nodes differently)."""
    def weights(b) -> Optional[str]:
        return ((b.manifest.get("files") or {}).get("target/openvino_model.bin") or {}).get("sha256")
    return weights(bundle) is not None and weights(bundle) == weights(other)


def other_draft_spec(spec: Spec, label: str, path) -> Spec:
    """The row `spec` with the draft of another bundle (same target): named LABEL:ROW."""
    return dataclasses.replace(spec, name=f"{label}:{spec.name}",
                               description=f"{spec.description}; with the draft of {label} ({path})")


def build_setups(bundle, specs: list[Spec], max_new_tokens: int, engine, say: Callable[[str], None],
                 other: Optional[tuple[Any, str]] = None, genai_draft=None) -> tuple[list[Setup], list[dict], Any]:
    """Load what the chosen rows need: our Pipelines with the EngineConfig `engine` (GenAI with its precision). A
    peer that cannot load is skipped with its reason; ours must load.
    other: (a bundle with the same target, its label): each of our rows that drafts with the draft model runs
    again with that bundle's draft, beside it (an aligned draft against the stock one, say). genai_draft: a bundle
    of the same target whose draft GenAI's speculative rows use (this bundle's draft has another vocabulary).

    Returns (setups, skipped [{"setup", "reason"}], our main Pipeline).
    """
    from ..runtime import Pipeline
    from ..runtime.algorithms import REGISTRY

    t = time.perf_counter()
    pipe = Pipeline(bundle, config=engine)
    say(f"loaded our Pipeline in {time.perf_counter() - t:.1f} s: {pipe.placement.describe()}; target "
        f"{pipe.target.rollback_method} KV, {pipe.target.precision} precision")
    pipe.compile_static_copies()  # timed as a server runs once its copies serve, not while they compile
    both = None
    if any(s.concurrent for s in specs):
        both = Pipeline(bundle, config=dataclasses.replace(engine, concurrent=True))
        both.compile_static_copies()
        say("loaded a second Pipeline with concurrent drafting")
    setups, skipped = [], []
    for spec in specs:
        if spec.engine == "ours":
            setups.append(Setup(spec, ours_runner(both if spec.concurrent else pipe, spec, max_new_tokens)))
    if other is not None:
        other_bundle, label = other
        t = time.perf_counter()
        theirs = Pipeline(other_bundle, config=engine)
        theirs.compile_static_copies()
        say(f"loaded {label}'s Pipeline ({other_bundle.path}) in {time.perf_counter() - t:.1f} s")
        setups += [Setup(other_draft_spec(spec, label, other_bundle.path), ours_runner(theirs, spec, max_new_tokens))
                   for spec in specs if spec.engine == "ours" and not spec.concurrent
                   and REGISTRY[spec.algorithm].needs_draft]

    for peer in ("genai", "genai-ours"):
        rows = [s for s in specs if s.engine == peer]
        if not rows:
            continue
        try:
            t = time.perf_counter()
            alone, sd, version = load_genai(bundle, peer, engine.precision, any(s.algorithm == "sd" for s in rows),
                                            genai_draft)
            say(f"loaded OpenVINO GenAI {version} pipelines ({peer}) in {time.perf_counter() - t:.1f} s")
        except ImportError as exc:
            reason = f"openvino_genai is not importable ({exc})"
        except Exception as exc:  # noqa: BLE001 - report what GenAI says about the folders, go on without it
            reason = f"GenAI refused the bundle folders: {type(exc).__name__}: {str(exc)[:300]}"
        else:
            setups += [Setup(s, genai_runner(sd if s.algorithm == "sd" else alone, s, max_new_tokens)) for s in rows]
            continue
        say(f"skipping {', '.join(s.name for s in rows)}: {reason}")
        skipped += [{"setup": s.name, "reason": reason} for s in rows]

    rows = [s for s in specs if s.engine == "hf"]
    if rows:
        try:
            t = time.perf_counter()
            target, tokenizer = load_hf(bundle.manifest, "target")
            say(f"loaded the transformers target (fp32) in {time.perf_counter() - t:.1f} s")
        except EdgeSpecdecError as exc:
            reason = str(exc)
            say(f"skipping {', '.join(s.name for s in rows)}: {reason}")
            skipped += [{"setup": s.name, "reason": reason} for s in rows]
        else:
            draft = draft_tokenizer = None
            for spec in rows:
                if spec.algorithm != "none" and draft is None:
                    try:
                        draft, draft_tokenizer = load_hf(bundle.manifest, "draft")
                    except EdgeSpecdecError as exc:
                        say(f"skipping {spec.name}: {exc}")
                        skipped.append({"setup": spec.name, "reason": str(exc)})
                        continue
                setups.append(Setup(spec, hf_runner(target, tokenizer, spec, max_new_tokens, draft,
                                                    draft_tokenizer)))
    order = {s.name: i for i, s in enumerate(specs)}
    setups.sort(key=lambda s: (order[s.name.split(":")[-1]], ":" in s.name))  # another draft's row after ours
    return setups, skipped, pipe


def _run_sampling_rss(setup: Setup, prompt: Prompt, sampler: RssSampler) -> Run:
    """One run of a row, with the whole process's RSS at its start and its peak during it."""
    start = sampler.start_window()
    try:
        run = setup.run(prompt)
    finally:
        peak = sampler.end_window()
    run.rss_start, run.rss_peak = start, peak
    return run


def _progress_line(run: Run) -> str:
    line = f"{run.new_tokens:4d} tok {run.wall_seconds:7.2f} s {run.tokens_per_s:8.1f} tok/s"
    if run.proposed:
        line += f"  acceptance {run.accepted / run.proposed:.2f}"
    return line


def run_rows(setups: list[Setup], prompts: list[Prompt], repeats: int, say: Callable[[str], None],
             sampler: RssSampler) -> bool:
    """One uncounted warm-up per row on the first prompt, then for each (repeat, prompt) every row back to back,
    the order rotated each time (interleave.py). Returns False if interrupted (Ctrl-C): what ran so far is kept."""
    def keep(s: Setup, prompt: Prompt, repeat: int, run: Run) -> None:
        s.runs[(prompt.key, repeat)] = run

    def fail(s: Setup, prompt: Prompt, repeat: int, error: str) -> None:
        s.failures.append({"prompt": prompt.key, "repeat": repeat, "error": error})
    say(f"warm-up: one uncounted run per setup on {prompts[0].key}")
    return run_interleaved(setups, prompts, repeats, say, name=lambda s: s.name, label=lambda p: f"{p.key:<32} ",
                           run=lambda s, p, repeat: _run_sampling_rss(s, p, sampler), show=_progress_line, keep=keep,
                           fail=fail, warm_ups=prompts[:1])


def run_benchmark(bundle: Union[str, Path], setups: Optional[Sequence[str]] = None, max_new_tokens: int = 64,
                  repeats: int = 2, ks: Sequence[int] = DEFAULT_KS, categories: Optional[Sequence[str]] = None,
                  out: Union[str, Path, None] = None, genai: bool = True, genai_ours: bool = False,
                  concurrent: bool = False, hf: bool = False, engine=None, command: Optional[str] = None,
                  progress: Optional[Callable[[str], None]] = None, plot: bool = True,
                  prompts_file: Union[str, Path, None] = None, other_draft: Union[str, Path, None] = None,
                  other_label: str = "other", genai_draft: Union[str, Path, None] = None,
                  genai_confidences: Sequence[float] = ()) -> dict[str, Any]:
    """Benchmark a bundle's decoders side by side, interleaved, in one run; write report.json, report.md and
    speedup.png (if matplotlib is installed and plot) into `out` (default bench-results/<bundle name>).

    prompts_file: the user's prompts instead of the shipped set (see prompt_file.py); categories then choose
    among the file's categories, and the report records the file (settings["prompts_file"]).
    other_draft: a bundle with the same target; every row of ours that drafts with the draft model also runs with
    its draft, as the row OTHER_LABEL:ROW (a stock draft beside an aligned one, in one interleaved run).
    genai_draft: a bundle of the same target with a same-vocabulary draft, which GenAI's speculative rows draft
    with (a bundle whose own draft has another vocabulary then gets GenAI rows too). genai_confidences: GenAI's
    assistant_confidence_threshold values, a speculative row each (default 0.7).

    setups: row names or shell patterns (see `edge_specdec.benchmark.setups`); default: every row the bundle
    allows except the optional families. genai_ours / concurrent / hf add those families, with or without setups.
    engine: the EngineConfig our Pipelines load with (default EngineConfig()); GenAI's rows take its precision.
    Returns the report (the content of report.json) with "files" listing what was written.
    """
    from ..bundle import load_bundle
    from ..runtime.settings import EngineConfig
    from . import report as _report

    say = progress or (lambda message: print(message, file=sys.stderr, flush=True))
    if max_new_tokens < 1:
        raise EdgeSpecdecError("--max-new-tokens must be at least 1.")
    if repeats < 1:
        raise EdgeSpecdecError("--repeats must be at least 1.")
    ks = list(dict.fromkeys(int(k) for k in ks))
    if not ks or min(ks) < 1:
        raise EdgeSpecdecError("--ks needs draft lengths of at least 1, e.g. --ks 3 5.")
    engine = engine or EngineConfig()
    patterns = [p for item in (setups or []) for p in str(item).split(",") if p.strip()]
    prompt_set = load_prompt_set(prompts_file)
    chosen_categories = pick_categories(prompt_set, categories)
    if any(not 0.0 < c < 1.0 for c in genai_confidences):
        raise EdgeSpecdecError(f"--genai-confidences {' '.join(map(str, genai_confidences))}: GenAI's "
                               f"assistant_confidence_threshold must be above 0 and below 1, e.g. 0.3 0.5 0.7.")
    b = load_bundle(bundle, verify=False)  # first the cheap checks: a bad bundle, setup or category fails fast
    relation = b.vocabulary["relation"]
    peer_draft = load_genai_draft(b, genai_draft, genai or genai_ours)
    candidates = candidate_specs(relation, ks, genai_ours=genai_ours, concurrent=concurrent, hf=hf, genai=genai,
                                 genai_confidences=genai_confidences, genai_draft=peer_draft is not None)
    families = [f for f, on in (("genai-ours", genai_ours), ("concurrent", concurrent), ("hf", hf)) if on]
    specs, notes = select_specs(candidates, patterns, relation, families)
    if not patterns and relation != "identical" and (genai or genai_ours) and peer_draft is None:
        notes.append(f"no GenAI rows by default for a {relation} bundle: GenAI's speculative decoding needs a draft "
                     f"with the target's vocabulary (--genai-draft BUNDLE gives it one; --setups genai-none runs "
                     f"its target alone)")
    for note in notes:
        say(note)
    out_dir = Path(out) if out is not None else Path("bench-results") / b.path.name
    if out_dir.exists() and not out_dir.is_dir():
        raise EdgeSpecdecError(f"--out {out_dir} is a file: give a folder for the report.")

    other = None
    if other_draft is not None:
        theirs = load_bundle(other_draft, verify=False)
        if theirs.draft is None or not same_target(b, theirs):
            raise EdgeSpecdecError(f"--other-draft {other_draft}: it needs a draft and the same target weights as "
                                   f"{b.path} (compared by their checksums), so that its rows differ by the draft "
                                   f"alone.")
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", other_label):
            raise EdgeSpecdecError(f"--other-label {other_label!r}: use letters, digits, '.', '_' or '-'.")
        other = (theirs, other_label)
    say(f"bench {b.path} ({relation} vocabulary): {len(specs)} setups: {', '.join(s.name for s in specs)}")
    loaded, skipped, pipe = build_setups(b, specs, max_new_tokens, engine, say, other, peer_draft)
    if not loaded:
        raise EdgeSpecdecError("nothing to run: every setup chosen was skipped ("
                               + "; ".join(f"{x['setup']}: {x['reason']}" for x in skipped) + ").")
    prompts, prompt_format = render_prompts(pipe, prompt_set, chosen_categories)
    say(f"{len(prompts)} prompts in {len(chosen_categories)} categor{'y' if len(chosen_categories) == 1 else 'ies'} "
        + (f"from {prompts_file} " if prompts_file else "") + f"({prompt_format}), {repeats} repeat(s), "
        f"{max_new_tokens} new tokens at most, greedy")
    machine = machine_info()  # after loading, so that the peers' versions are known
    sampler = RssSampler()
    try:
        complete = run_rows(loaded, prompts, repeats, say, sampler)
    finally:
        sampler.close()
    note_load_at_end(machine)
    settings = {"bundle": str(b.path), "relation": relation, "max_new_tokens": max_new_tokens, "repeats": repeats,
                "ks": ks, "categories": chosen_categories, "precision": engine.precision,
                "kv_rollback": engine.kv_rollback,
                "draft_output_ids": None if pipe.draft is None or pipe.draft.output_ids is None
                else len(pipe.draft.output_ids),
                "prompt_format": prompt_format, "prompts_file": prompt_source(prompts_file, prompt_set),
                "other_draft": {"bundle": str(other[0].path), "label": other[1]} if other else None,
                "genai_draft": str(peer_draft.path) if peer_draft is not None else None,
                "default_algorithm": pipe.resolve_algorithm("auto"),
                "placement": pipe.placement.describe(),
                "target_rollback": pipe.target.rollback_method, "greedy": True, "interrupted": not complete,
                "rss_sampling": "available" if sampler.available else "unavailable (no /proc/self/statm)"}
    result = _report.build_report(loaded, prompts, settings, machine, b.manifest, skipped, notes, command)
    result["files"] = _report.write_report(result, out_dir, plot=plot, say=say)
    return result


__all__ = ["DEFAULT_KS", "run_benchmark"]
