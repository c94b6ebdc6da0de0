"""align_bundle: the stages of `edge-specdec align`, each resumable, within one time budget.

    baseline   the source bundle's acceptance and tokens per target pass on the held-out prompts
    plan       the training rate measured on this machine, and the time kept back for the last stages
    generate   the target's greedy continuations of the training prompts -> WORK/data.jsonl
    train      the draft fine-tuned on them (top layers, early stopping) -> WORK/draft-hf
    export     the fine-tuned draft in the bundle's draft weight format -> WORK/draft-ir
    evaluate   the new bundle built in WORK/bundle (target files hard-linked) and measured as in baseline
    write      the manifest's alignment record, then WORK/bundle renamed to --out

The budget (--minutes) covers every stage of every run of one align (a resume continues the clock). Generation
runs while the time left still covers one pass of training over what it has generated (at the measured rate) plus
the stages after training, so that the budget buys as much text as can still be trained on; training then runs
until its deadline, at most --epochs passes, unless early stopping ends it before.
"""
from __future__ import annotations

import resource
import shutil
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Optional

from ...bundle import Bundle, load_bundle, sha256_file
from ...errors import ExportError
from .. import _check_output, _with_elapsed
from ..sources import count_parameters, resolve_source
from .assemble import build_bundle, export_aligned_draft, move_into_place, weight_settings, write_manifest
from .evaluate import evaluate_bundle
from .generate import TARGET_TOP, generate_data
from .prompts import PACKAGED_PROMPTS, prompts_sha256, training_prompts
from .train import PRECISIONS, TRAINING_OVERHEAD, TrainSettings, probe_rate, train_draft
from .work import STAGES, Budget, WorkFolder

# Time kept back for exporting the draft: a fixed part, and a part per million draft parameters (the conversion
# and the NNCF compression grow with the model).
EXPORT_SECONDS_FIXED = 20.0
EXPORT_SECONDS_PER_MPARAM = 0.4
SLACK_SHARE = 0.02        # of the budget, kept free for what the estimates miss


@dataclass(frozen=True)
class AlignSettings:
    prompts: Optional[str] = None       # a prompt file (read_prompt_file's forms); None: the package's set
    tokens: Optional[int] = None        # at most this many target tokens of training text
    minutes: float = 60.0               # the budget of the whole align
    max_new_tokens: int = 256           # target tokens per continuation
    streams: int = 16                   # prompts generated at once
    eval_prompts: Optional[int] = None  # held-out prompts measured before and after (None: all)
    eval_tokens: int = 128              # tokens generated per held-out prompt
    train: TrainSettings = field(default_factory=TrainSettings)

    def validate(self) -> "AlignSettings":
        if not self.minutes > 0:
            raise ExportError(f"--minutes {self.minutes:g}: the budget must be more than 0 minutes.")
        for name, value in (("--tokens", self.tokens), ("--max-new-tokens", self.max_new_tokens),
                            ("--streams", self.streams), ("--eval-prompts", self.eval_prompts),
                            ("--eval-tokens", self.eval_tokens), ("--batch-tokens", self.train.batch_tokens),
                            ("--train-layers", self.train.train_layers)):
            if value is not None and value < 1:
                raise ExportError(f"{name} {value}: must be at least 1.")
        if not self.train.epochs > 0:
            raise ExportError(f"--epochs {self.train.epochs:g}: must be more than 0.")
        if self.train.precision not in (None,) + PRECISIONS:
            raise ExportError(f"--train-precision {self.train.precision}: choose one of {', '.join(PRECISIONS)}.")
        if not 0.0 <= self.train.soft_weight <= 1.0:
            raise ExportError(f"--soft-weight {self.train.soft_weight:g}: must be from 0 (the target's tokens "
                              "only) to 1 (its distribution only where it has one).")
        if not self.train.learning_rate > 0:
            raise ExportError(f"--learning-rate {self.train.learning_rate:g}: must be more than 0.")
        return self


def default_work(out: Path) -> Path:
    """The work folder beside --out (hidden), so that it sits on the same file system as the bundle."""
    return out.parent / f".{out.name}.align-work"


def align_bundle(bundle: str | Path, out: str | Path, settings: AlignSettings = AlignSettings(), *,
                 draft_source: Optional[str] = None, work: str | Path | None = None, resume: bool = False,
                 force: bool = False, keep_work: bool = False, stop_after: Optional[str] = None,
                 progress: Optional[Callable[[str], None]] = None,
                 on_train_step: Optional[Callable[[int], None]] = None) -> Optional[Path]:
    """Align the draft of `bundle` to its target and write the aligned bundle to `out`; return out (None when
    stop_after ended the run early: `resume=True` continues it)."""
    say = _with_elapsed(progress)
    settings.validate()
    if stop_after is not None and stop_after not in STAGES:
        raise ExportError(f"--stop-after {stop_after!r}: choose one of {', '.join(STAGES)}.")
    out = Path(out).expanduser().absolute()
    _check_output(out, force)
    verify_start = time.monotonic()
    source = load_bundle(Path(bundle).expanduser(), verify=True)
    hash_seconds = time.monotonic() - verify_start
    if source.draft is None:
        raise ExportError(f"{source.path} has no draft (a target-only bundle): align fine-tunes a bundle's draft; "
                          "export one with --draft first.")
    draft_settings = weight_settings(source)
    folder = WorkFolder(Path(work).expanduser().absolute() if work else default_work(out))
    draft_folder = _draft_folder(source, draft_source, folder.path)
    prompts, dropped = training_prompts(settings.prompts, settings.train.seed)
    fixed = {"bundle": str(source.path.absolute()),
             "bundle_manifest_sha256": sha256_file(source.path / "manifest.json"),
             "draft_source": str(draft_folder), "prompts_sha256": prompts_sha256(settings.prompts),
             "max_new_tokens": settings.max_new_tokens, "eval_prompts": settings.eval_prompts,
             "eval_tokens": settings.eval_tokens, "seed": settings.train.seed}
    folder.open(fixed, resume)
    budget = Budget(settings.minutes, folder.state.get("spent_seconds", 0.0))
    if resume:
        done = [s for s in STAGES if folder.done(s)]
        say(f"resuming the align in {folder.path}: done {', '.join(done) or 'nothing yet'}; "
            f"{budget.elapsed() / 60:.1f} of {settings.minutes:g} min spent")
    if dropped:
        say(f"prompts: {dropped} training prompts dropped because they are held-out (benchmark) prompts")
    try:
        return _run_stages(source, out, settings, folder, budget, draft_folder, draft_settings, prompts, dropped,
                           hash_seconds, keep_work, stop_after, say, on_train_step)
    finally:
        if folder.path.is_dir() and (folder.path / "state.json").is_file():
            folder.add_spent(budget.session_seconds())


def _run_stages(source: Bundle, out: Path, settings: AlignSettings, folder: WorkFolder, budget: Budget,
                draft_folder: Path, draft_settings, prompts, dropped: int, hash_seconds: float, keep_work: bool,
                stop_after: Optional[str], say: Callable[[str], None],
                on_train_step: Optional[Callable[[int], None]]) -> Optional[Path]:
    _reopen_generation_if_data_lost(folder, say)
    for stage in STAGES:
        if folder.done(stage):
            continue
        started = time.monotonic()
        if stage == "baseline":
            result = evaluate_bundle(source.path, settings.eval_prompts, settings.eval_tokens, say, "before")
        elif stage == "plan":
            result = _plan(source, settings, folder, budget, draft_folder, hash_seconds, say)
        elif stage == "generate":
            result = _generate(source, settings, folder, budget, prompts, say)
        elif stage == "train":
            plan = folder.result("plan")
            result = train_draft(draft_folder, source, folder, settings.train, plan["train_tokens_per_s"],
                                 plan["train_precision"],
                                 lambda: budget.left() - plan["reserve_after_training_seconds"], say,
                                 on_train_step)
        elif stage == "export":
            say(f"export: the fine-tuned draft to OpenVINO IR, weights {draft_settings.format} (as the bundle's)")
            stats = export_aligned_draft(folder.draft_hf, draft_settings, folder.draft_ir, folder.path / "scratch",
                                         say)
            result = {"weights": {**draft_settings.to_manifest(), **stats}}
        elif stage == "evaluate":
            built = build_bundle(source, folder.draft_hf, folder.draft_ir, draft_settings,
                                 folder.result("export")["weights"], folder.bundle, say)
            write_manifest(folder.bundle, built["manifest"], alignment=None)
            result = {"after": evaluate_bundle(folder.bundle, settings.eval_prompts, settings.eval_tokens, say,
                                               "after"),
                      "linked": built["linked"], "copied": built["copied"]}
        else:  # write
            alignment = _alignment_record(source, settings, folder, draft_folder, dropped, budget)
            write_manifest(folder.bundle, None, alignment)
            move_into_place(folder.bundle, out, say)
            result = {}
        seconds = time.monotonic() - started + folder.result(stage).get("seconds_spent", 0.0)
        folder.finish(stage, {**result, "seconds_spent": round(seconds, 1)})
        if stage == "write":
            break
        if stage == stop_after:
            say(f"stopped after the {stage} stage, as asked: run the same command with --resume to continue "
                f"(work folder {folder.path})")
            return None
    before, after = folder.result("baseline"), folder.result("evaluate")["after"]
    say(f"aligned bundle written to {out}: acceptance {before['acceptance']:.3f} -> {after['acceptance']:.3f}, "
        f"tokens per target pass {before['tokens_per_target_pass']:.2f} -> {after['tokens_per_target_pass']:.2f} "
        f"on {after['prompts']} held-out prompts; {budget.elapsed() / 60:.1f} of {settings.minutes:g} min")
    if not keep_work:
        shutil.rmtree(folder.path, ignore_errors=True)
    return out


def _reopen_generation_if_data_lost(folder: WorkFolder, say: Callable[[str], None]) -> None:
    """Before training, data.jsonl must hold what generation wrote: when lines were damaged or lost since (the file
    deleted, emptied or cut short), the generate stage runs again, which keeps every intact record and generates the
    other prompts again (as the budget allows). Once training is done, what it trained on is recorded and the data
    is not read again."""
    if not folder.done("generate") or folder.done("train"):
        return
    records, damaged = folder.scan_data()
    written = folder.result("generate").get("prompts", 0)
    name = folder.data_file.name
    if not folder.data_file.is_file():
        say(f"generate: {folder.data_file}, the {written} records generation wrote, is gone (deleted or moved "
            f"since): generating them again as the budget allows (to use the old file instead, put it back and run "
            f"again with --resume)")
    elif damaged:
        say(f"generate: {damaged} damaged lines in {name} are skipped ({len(records)} intact records "
            "kept); generating their prompts again")
    elif len(records) < written:
        say(f"generate: {name} holds {len(records)} of the {written} records generation wrote (lines removed "
            "since): generating the others again")
    else:
        return
    folder.record("generate", {})


def _draft_folder(source: Bundle, override: Optional[str], work: Path) -> Path:
    """The draft's original Hugging Face folder: --draft-source, else the source the manifest records; checked
    to be the model the bundle's draft was exported from (same tokenizer.json, same parameter count)."""
    recorded = source.draft.info["source"]
    given = override or recorded["given"]
    if override is None and recorded.get("kind") != "hub" and not Path(given).expanduser().exists():
        raise ExportError(f"the bundle's draft was exported from {given}, which is not on this machine: pass the "
                          "draft's original Hugging Face folder with --draft-source PATH.")
    with _quiet():
        resolved = resolve_source(given, work, "draft-source", lambda message: None)
    tokenizer = resolved.folder / "tokenizer.json"
    expected = source.manifest["files"].get("draft/tokenizer.json", {}).get("sha256")
    if expected is None or not tokenizer.is_file() or sha256_file(tokenizer) != expected:
        raise ExportError(f"--draft-source {given}: its tokenizer.json is not the one of the bundle's draft, so it "
                          "is not the model the bundle was exported from; pass that model's folder.")
    params = count_parameters(resolved.folder)
    if params != source.draft.info["num_parameters"]:
        raise ExportError(f"--draft-source {given}: {params / 1e6:.1f}M parameters, but the bundle's draft has "
                          f"{source.draft.info['num_parameters'] / 1e6:.1f}M; pass the model the bundle's draft was "
                          "exported from.")
    return resolved.folder


def _quiet():
    from ..convert import quiet_libraries
    return quiet_libraries()


def _plan(source: Bundle, settings: AlignSettings, folder: WorkFolder, budget: Budget, draft_folder: Path,
          hash_seconds: float, say: Callable[[str], None]) -> dict[str, Any]:
    """Measure the training rate and decide what the last stages need; print the plan."""
    # a training sequence: the prompt (a chat template and a question, roughly) and a continuation of about the
    # same length in draft tokens as the target's
    sequence = 96 + settings.max_new_tokens
    rates = probe_rate(draft_folder, settings.train.train_layers, sequence, source.draft.info["logits_size"])
    precision = settings.train.precision or max(rates, key=rates.get)
    rate = rates[precision]
    baseline = folder.result("baseline")
    params = source.draft.info["num_parameters"] / 1e6
    export = EXPORT_SECONDS_FIXED + EXPORT_SECONDS_PER_MPARAM * params
    reserve = baseline["seconds"] + export + 3 * hash_seconds + SLACK_SHARE * budget.total
    left = budget.left() - reserve
    say(f"plan: {settings.minutes:g} min budget, {budget.elapsed() / 60:.1f} spent; {reserve / 60:.1f} min kept for "
        f"the export, the evaluation after and the bundle; training runs at {rate:.0f} draft tokens/s here in "
        f"{precision} ({', '.join(f'{p} {r:.0f}' for p, r in rates.items())}), so "
        f"generation goes on while the time left covers one pass of training over its text"
        + (f", up to {settings.tokens:,} target tokens" if settings.tokens else "")
        + f" ({left / 60:.1f} min for both)")
    if left <= 0:
        raise ExportError(f"--minutes {settings.minutes:g} is spent before generation could start (the "
                          f"evaluations and the export alone need about {reserve / 60:.1f} min after "
                          f"{budget.elapsed() / 60:.1f} min): give more --minutes, or fewer --eval-prompts.")
    return {"train_tokens_per_s": round(rate, 2), "train_precision": precision,
            "train_tokens_per_s_by_precision": {p: round(r, 2) for p, r in rates.items()},
            "reserve_after_training_seconds": round(reserve, 1),
            "export_allowance_seconds": round(export, 1), "hash_seconds": round(hash_seconds, 2)}


def _generate(source: Bundle, settings: AlignSettings, folder: WorkFolder, budget: Budget, prompts,
              say: Callable[[str], None]) -> dict[str, Any]:
    plan = folder.result("plan")
    rate, reserve = plan["train_tokens_per_s"], plan["reserve_after_training_seconds"]

    def keep_going(totals: dict[str, Any]) -> bool:
        if settings.tokens is not None and totals["target_tokens"] >= settings.tokens:
            return False
        one_pass = TRAINING_OVERHEAD * totals["train_draft_tokens"] / rate
        return budget.left() - reserve > one_pass

    say(f"generate: {len(prompts)} training prompts, up to {settings.max_new_tokens} tokens each, "
        f"{settings.streams} at once")
    return generate_data(source.path, prompts, folder, settings.max_new_tokens, settings.streams, keep_going, say,
                         top=TARGET_TOP if settings.train.soft_weight > 0 else 0)


def _alignment_record(source: Bundle, settings: AlignSettings, folder: WorkFolder, draft_folder: Path,
                      dropped: int, budget: Budget) -> dict[str, Any]:
    # the data training read (an align trained before that was recorded: what generation counted)
    train = folder.result("train")
    data = train.get("data") or folder.result("generate")
    seconds = {stage: folder.result(stage).get("seconds_spent") for stage in STAGES if folder.done(stage)}
    return {
        "method": "sequence-level distillation: the draft fine-tuned on its target's greedy continuations, "
                  "tokenized as the runtime gives the text to the draft"
                  + (f"; labels mixed with {settings.train.soft_weight:g} of the target's distribution where the "
                     "two tokenizations agree" if settings.train.soft_weight else ""),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "source_bundle": str(source.path),
        "draft_source": str(draft_folder),
        "prompts": {"file": settings.prompts or f"package: {PACKAGED_PROMPTS.name}",
                    "sha256": folder.state["fixed"]["prompts_sha256"], "held_out_dropped": dropped},
        "data": {k: data.get(k) for k in ("prompts", "train_prompts", "validation_prompts", "target_tokens",
                                          "train_draft_tokens")} | {"max_new_tokens": settings.max_new_tokens},
        "training": {k: v for k, v in train.items() if k not in ("done", "seconds_spent", "data")},
        "evaluation": {"prompts": "the benchmark's held-out prompts (edge_specdec/benchmark/prompts.json), none of "
                                  "them trained on",
                       "before": _without_done(folder.result("baseline")),
                       "after": folder.result("evaluate")["after"]},
        "budget_minutes": settings.minutes,
        "seconds_by_stage": seconds,
        "minutes_total": round(budget.elapsed() / 60, 2),
        "peak_rss_mb_this_run": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def _without_done(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k not in ("done", "seconds_spent")}
