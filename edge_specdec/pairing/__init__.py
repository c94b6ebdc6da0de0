"""`edge-specdec pair`: which draft fits a target, predicted from simulated rounds.

    from edge_specdec.pairing import PairSettings, find_pair
    report = find_pair("qwen-1.5b/", ["drafts/"], PairSettings(top=2))
    report = find_pair("qwen-1.5b/", ["drafts/"], PairSettings(sampling=Sampling(temperature=0.7)))

Four steps:
1. the cheap look (candidates.py): every draft's vocabulary relation and weights, read from tokenizer.json or
   the GGUF header, and whether the export admits it; nothing is converted;
2. the best `top` of the admitted drafts by that look are exported into bundles beside the target (the target is
   exported once, then copied as the IR it became);
3. the target's greedy answers to the prompts (or, with `sampling`, its sampled answers and its probabilities of
   their tokens: sampled.py) are computed once, and each candidate (the target alone, free drafts only, each
   exported draft) is replayed against them through the runtime's own decode loop (replay.py);
4. the rounds are priced with the target's measured call costs and the loop's own seconds, and ranked (rank.py).
`export` then writes the best candidate's bundle (or the named one's).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import sys
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Union

from ..bundle import MANIFEST_FILE
from ..catalog import load_catalog
from ..errors import EdgeSpecdecError
from .candidates import (Candidate, Source, admission, cheap_rank, classify, look, manifest_files, one_line,
                         read_vocabulary)
from .entry import catalog_entry
from .sampled import Sampling

PROMPTS_FILE = Path(__file__).resolve().parent.parent / "data" / "pair_prompts.json"
TASKS = ("code", "chat", "text")
NO_DRAFT, FREE_DRAFTS = "no draft", "free drafts only"


@dataclass(frozen=True)
class PairSettings:
    """What `pair` simulates and keeps. top: drafts exported and simulated (the best by the cheap look);
    task: the kind of the built-in prompts; prompts: your own instead (texts); max_new_tokens: the length of each
    answer; export: a folder to write the best candidate's bundle to; export_candidate: that candidate's name
    instead of the best; force: replace a bundle already there; look_only: the cheap look alone (nothing converted,
    nothing run); sampling: predict sampled decoding with these settings (sampled.Sampling; None: greedy);
    engine: the EngineConfig fields the models run with (devices, precision, threads, ...)."""
    top: int = 2
    task: str = "code"
    prompts: Optional[tuple[str, ...]] = None
    max_new_tokens: int = 64
    export: Optional[Path] = None
    export_candidate: Optional[str] = None
    force: bool = False
    look_only: bool = False
    sampling: Optional[Sampling] = None
    engine: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.top, int) or self.top < 0:
            raise EdgeSpecdecError(f"top must be 0 or more drafts to simulate, not {self.top!r}.")
        if self.task not in TASKS:
            raise EdgeSpecdecError(f"task must be one of {', '.join(TASKS)}, not {self.task!r}.")
        if self.prompts is not None and not [p for p in self.prompts if p.strip()]:
            raise EdgeSpecdecError("the prompts file holds no prompt: write one prompt per line (or a JSON list).")
        if self.look_only and self.export is not None:
            raise EdgeSpecdecError("--look converts nothing, so there is no bundle to --export: drop one of them.")
        if self.sampling is not None and not isinstance(self.sampling, Sampling):
            raise EdgeSpecdecError(f"sampling must be a pairing.Sampling or None (greedy), not {self.sampling!r}.")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 2:
            raise EdgeSpecdecError(f"max_new_tokens must be at least 2 (a first round, then the rounds priced), "
                                   f"not {self.max_new_tokens!r}.")

    def prompt_list(self) -> list[str]:
        if self.prompts is not None:
            return [p for p in self.prompts if p.strip()]
        return json.loads(PROMPTS_FILE.read_text(encoding="utf-8"))[self.task]


def read_prompts(path: Union[str, Path]) -> tuple[str, ...]:
    """A prompts file: a JSON list of strings, or one prompt per line (write \\n for a newline inside one)."""
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except OSError as exc:
        raise EdgeSpecdecError(f"--prompts {path}: cannot read it ({exc.strerror}). Check the path.") from None
    if text.lstrip().startswith("["):
        prompts = json.loads(text)
        if not all(isinstance(p, str) for p in prompts):
            raise EdgeSpecdecError(f"{path}: a JSON prompts file is a list of strings.")
        return tuple(prompts)
    return tuple(line.replace("\\n", "\n") for line in text.splitlines() if line.strip())


def find_pair(target: str, drafts: list[str], settings: Optional[PairSettings] = None,
              say: Callable[[str], None] = lambda _: None, core=None) -> dict[str, Any]:
    """The whole `pair` run (see the module's docstring); returns the report `--json` prints."""
    settings = settings or PairSettings()
    catalog = _catalog()
    target_source = classify(target, "target", catalog)[0]
    given = [s for d in drafts for s in classify(d, "draft", catalog)]
    if target_source.kind == "bundle" and (target_source.path.parent / "draft").is_dir():  # its own draft too
        given.insert(0, Source(target, "bundle", target_source.path.parent / "draft", target_source.name))
    sources = [s for s in _unique(given) if not _same_model(s, target_source)]  # a scanned folder may hold it
    refused = admission(target_source, "target")
    if refused:
        raise EdgeSpecdecError(f"the target {target} cannot be used: {refused}")
    prompts = settings.prompt_list()
    say(f"reading the vocabularies (tokenizer.json or GGUF headers; nothing converted): {target_source.name} and "
        f"{len(sources)} draft{'' if len(sources) == 1 else 's'}")
    target_vocab = read_vocabulary(target_source)
    text = "\n".join(prompts)
    looked = [look(target_source, target_vocab, s, text, say) for s in sources]
    chosen = cheap_rank(looked)[:settings.top]
    candidates = [Candidate(NO_DRAFT, None, "none"), Candidate(FREE_DRAFTS, None, "suffix")] + looked
    if settings.export_candidate is not None:  # named before anything is converted: checked now
        named = next((c for c in candidates if c.name == settings.export_candidate), None)
        if named is None or named.refused:
            raise EdgeSpecdecError(f"--export-candidate {settings.export_candidate!r}: " + (
                f"not usable: {named.refused}" if named else
                f"no such candidate; choose one of {', '.join(repr(c.name) for c in candidates)}."))
        if named.has_draft and named not in chosen:
            chosen.append(named)
    if settings.look_only:
        return _report(target_source, candidates, chosen, {}, [], {}, settings, prompts)
    if settings.export is not None:  # an OUT that cannot be written fails now, not after the simulation
        from ..export import _check_output
        _check_output(Path(settings.export).expanduser().absolute(), settings.force)
    work = _work_folder(settings.export)
    try:
        base = _target_bundle(target_source, work, say)
        for c in chosen:
            _draft_bundle(c, base, work, say)
        simulated = candidates[:2] + [c for c in chosen if c.bundle is not None]
        predictions, costs = _simulate(base, simulated, prompts, settings, say, core)
        from .rank import rank
        ranking = rank(predictions, costs["timing_noise"])
        report = _report(target_source, candidates, chosen, predictions, ranking, costs, settings, prompts)
        report.update(measured_here(base, candidates, report))
        if settings.export is not None:
            name = settings.export_candidate or ranking[0]["name"]
            report["exported"] = _export(name, candidates, base, settings, say)
        return report
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _catalog() -> dict[str, dict[str, Any]]:
    try:
        return load_catalog()
    except EdgeSpecdecError:
        return {}


def _unique(sources: list[Source]) -> list[Source]:
    """Each source once, names made unique (two folders may share a name)."""
    seen, out = set(), []
    for s in sources:
        key = str(s.path.resolve()) if s.path is not None else s.given
        if key in seen:
            continue
        seen.add(key)
        names = {o.name for o in out}
        base, n = s.name, 2
        while s.name in names or s.name in (NO_DRAFT, FREE_DRAFTS):
            s.name, n = f"{base}-{n}", n + 1
        out.append(s)
    return out


def _same_model(a: Source, b: Source) -> bool:
    return (a.path.resolve() == b.path.resolve()) if a.path is not None and b.path is not None else a.given == b.given


def _work_folder(export: Optional[Path]) -> Path:
    """Where candidates' bundles are exported: beside --export's folder (the best is then renamed into place),
    else in the system's temporary folder. Removed at the end."""
    import tempfile

    if export is None:
        return Path(tempfile.mkdtemp(prefix="edge-specdec-pair-"))
    export = Path(export).expanduser().absolute()
    export.parent.mkdir(parents=True, exist_ok=True)
    work = export.parent / f".{export.name}.pair-{uuid.uuid4().hex[:8]}"
    work.mkdir()
    return work


def _safe(name: str) -> str:
    return re.sub(r"[^\w.-]+", "_", name)


@contextmanager
def _stdout_to_stderr():
    """Everything written to stdout meanwhile goes to stderr, at the file descriptor: the export's libraries
    (NNCF's tables) print to stdout, which holds only pair's report."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _target_bundle(source: Source, work: Path, say: Callable[[str], None]) -> Path:
    """A bundle that holds the target: the given bundle itself, else the target exported alone into `work`."""
    if source.kind == "bundle":
        return source.path.parent
    from ..export import export_bundle

    say(f"exporting the target {source.given} once (each candidate's bundle copies it)")
    with _stdout_to_stderr():
        return export_bundle(source.export_source, None, work / "target-only", progress=say)


def _draft_bundle(c: Candidate, base: Path, work: Path, say: Callable[[str], None]) -> None:
    """The candidate's bundle: a given bundle that holds the same target as it is, else the base's target (an IR,
    copied as it is) with the draft exported beside it. A draft the export refuses keeps its reason instead."""
    from ..export import export_bundle
    from ..errors import ExportError

    if c.source.kind == "bundle" and manifest_files(c.source.path.parent, "target") == manifest_files(base, "target"):
        c.bundle = c.source.path.parent
        return
    say(f"exporting the draft {c.source.given} beside the target")
    try:
        with _stdout_to_stderr():
            c.bundle = export_bundle(str(base / "target"), c.source.export_source, work / _safe(c.name),
                                     generation_defaults=_generation_defaults(base), progress=say)
    except (ExportError, EdgeSpecdecError) as exc:
        c.refused = one_line(str(exc))
        return
    c.weights_bytes = (c.bundle / "draft" / "openvino_model.bin").stat().st_size
    c.weights_note = "its exported weights"


def _generation_defaults(bundle: Path) -> dict[str, Any]:
    """The defaults a bundle records (the demo's repetition penalty): a candidate's bundle keeps its target's."""
    manifest = json.loads((bundle / MANIFEST_FILE).read_text(encoding="utf-8"))
    return dict(manifest.get("generation_defaults") or {})


def _simulate(base: Path, candidates: list[Candidate], prompts: list[str], settings: PairSettings,
              say: Callable[[str], None], core) -> tuple[dict, dict]:
    """The greedy (or sampled) answers on the base bundle, every candidate replayed against them, the target's call
    costs, and each candidate's prediction."""
    from ..runtime import Engine, EngineConfig, SpeculativeConfig
    from .rank import cost_function, predict, target_costs, timing_noise
    from .replay import greedy_answers, replay
    from .sampled import sampled_answers

    # the replay prices decode rounds: auto's long-prompt prefill copy would only hold memory in each engine loaded
    prefill = settings.engine.get("long_prompt_precision", "auto")
    config = EngineConfig(**{**settings.engine, "concurrent": False, "static_shapes": False,
                             "long_prompt_precision": "off" if prefill == "auto" else prefill})
    mode = "greedy" if settings.sampling is None else "sampled"
    say(f"loading the target ({base.name}) and computing its {mode} answers to {len(prompts)} prompts "
        f"({settings.max_new_tokens} tokens each)")
    engine = Engine(base, config, core=core)
    if settings.task == "chat" and settings.prompts is None and engine.chat_template is not None:
        prompts = [engine.chat_prompt([{"role": "user", "content": p}]) for p in prompts]
    answers = (greedy_answers(engine, prompts, settings.max_new_tokens, say) if settings.sampling is None
               else sampled_answers(engine, prompts, settings.max_new_tokens, settings.sampling, say))
    runs = {}
    for c in candidates:
        if c.has_draft:
            say(f"simulating {c.name} ({c.auto.get(mode, 'auto')}) on the answers")
            try:
                candidate_engine = Engine(c.bundle, config, core=engine.core)
                c.placement = {"target": candidate_engine.placement.target,
                               "draft": candidate_engine.placement.draft}
                runs[c.name] = replay(candidate_engine, answers, SpeculativeConfig(algorithm="auto"))
            except EdgeSpecdecError as exc:  # a bundle that does not load here (a device, a file): its line
                c.refused = one_line(str(exc))
            candidate_engine = None  # its compiled models go before the next candidate's load
        else:
            say(f"simulating {c.name} on the answers")
            runs[c.name] = replay(engine, answers, SpeculativeConfig(algorithm=c.algorithm))
    sizes = {1} | {n for rs in runs.values() for r in rs for n in r.target_sizes()}
    say(f"timing the target's calls of {', '.join(map(str, sorted(sizes)))} tokens")
    samples = target_costs(engine.target_model.session(), sizes)
    t = cost_function(samples)
    alone = runs[NO_DRAFT]
    predictions = {name: predict(alone, rs, t) for name, rs in runs.items()}
    costs = {"target_call_ms": {n: 1000 * t(n) for n in sorted(sizes)}, "timing_noise": timing_noise(samples),
             "loop_ms_per_round": {name: 1000 * _mean_gap(rs) for name, rs in runs.items()}}
    return predictions, costs


def _mean_gap(runs) -> float:
    gaps = [c.gap for r in runs for c in r.calls[1:]]
    return sum(gaps) / len(gaps) if gaps else 0.0


def _report(target: Source, candidates: list[Candidate], chosen: list[Candidate], predictions: dict,
            ranking: list[dict], costs: dict, settings: PairSettings, prompts: list[str]) -> dict[str, Any]:
    places = {r["name"]: r for r in ranking}
    rows = []
    for c in candidates:
        p = predictions.get(c.name)
        row = {"name": c.name, "source": c.source.given if c.source else None,
               "kind": c.source.kind if c.source else None, "relation": c.relation, "vocabulary": c.vocabulary,
               "algorithm": {"greedy": c.algorithm, "sampled": c.algorithm} if not c.has_draft else c.auto,
               "weights_bytes": c.weights_bytes, "weights_note": c.weights_note,
               "admitted": not c.refused, "refused": c.refused or None,
               "simulated": p is not None,
               "why_not_simulated": None if p is not None or c.refused or settings.look_only else
               f"below the best {settings.top} by the cheap look (--top to simulate more)",
               "cheap_place": chosen.index(c) + 1 if c in chosen else None,
               "place": places.get(c.name, {}).get("place"), "tie": places.get(c.name, {}).get("tie", False)}
        if p is not None:
            row["prediction"] = {"speedup": p.speedup, "per_prompt": p.speedups, "rounds": p.rounds,
                                 "drafted": p.drafted, "accepted": p.accepted,
                                 "acceptance": p.accepted / p.drafted if p.drafted else None,
                                 "free_proposed": p.free_proposed, "free_accepted": p.free_accepted,
                                 "new_tokens": p.new_tokens}
        rows.append(row)
    rows.sort(key=lambda r: (r["place"] is None, r["place"] or 0, not r["admitted"],
                             r["source"] is not None and r["cheap_place"] is None, r["cheap_place"] or 0))
    return {"target": target.given, "prompts": len(prompts), "task": settings.task if settings.prompts is None
            else "file", "max_new_tokens": settings.max_new_tokens, "candidates": rows, "costs": costs,
            "best": ranking[0]["name"] if ranking else None, "look_only": settings.look_only,
            "simulated_drafts": [c.name for c in chosen],
            "decoding": "greedy" if settings.sampling is None else settings.sampling.describe(),
            "sampling": None if settings.sampling is None else dataclasses.asdict(settings.sampling),
            "sampled": ("not simulated: the table gives auto's sampled algorithm; the prediction is greedy's "
                        "(--sampling predicts sampled decoding)") if settings.sampling is None else
            "simulated: the prediction is sampled decoding's (auto's sampled algorithm)"}


def measured_here(base: Path, candidates: list[Candidate], report: dict[str, Any]) -> dict[str, Any]:
    """What a catalog entry needs beside the predictions (entry.py): the machine and the date of the simulation,
    the target's weight format, and each simulated draft's weight format and placement (on its report row)."""
    from ..benchmark.machine import machine_info

    rows = {row["name"]: row for row in report["candidates"]}
    for c in candidates:
        if c.has_draft and c.bundle is not None and rows[c.name]["simulated"]:
            rows[c.name]["draft_weights"] = _weights_format(c.bundle, "draft")
            rows[c.name]["placement"] = c.placement
    return {"machine": machine_info(), "target_weights": _weights_format(base, "target")}


def _weights_format(bundle: Path, role: str) -> Optional[str]:
    manifest = json.loads((bundle / MANIFEST_FILE).read_text(encoding="utf-8"))
    return (manifest.get(role) or {}).get("weights", {}).get("format")


def _export(name: str, candidates: list[Candidate], base: Path, settings: PairSettings,
            say: Callable[[str], None]) -> str:
    """Write the named candidate's bundle to settings.export: renamed into place from the work folder (a bundle
    the user gave is copied), atomically; the candidates without a draft export the target alone."""
    from ..export import _check_output, _move_into_place

    by_name = {c.name: c for c in candidates}
    if name not in by_name:
        raise EdgeSpecdecError(f"--export-candidate {name!r}: no such candidate; choose one of "
                               f"{', '.join(map(repr, by_name))}.")
    c = by_name[name]
    bundle = c.bundle if c.has_draft else base
    if bundle is None:
        raise EdgeSpecdecError(f"--export-candidate {name!r} has no bundle: "
                               f"{c.refused or 'it was not simulated (raise --top)'}.")
    out = Path(settings.export).expanduser().absolute()
    _check_output(out, settings.force)
    partial = out.parent / f".{out.name}.partial-{uuid.uuid4().hex[:8]}"
    try:
        if bundle.parent.name.startswith(f".{out.name}.pair-"):  # exported here: renamed, not copied
            bundle.rename(partial)
        else:
            shutil.copytree(bundle, partial)
        _move_into_place(partial, out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    say(f"the bundle of {name} written to {out}")
    return str(out)
