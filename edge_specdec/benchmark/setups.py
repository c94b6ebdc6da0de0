"""The rows of a benchmark: which setups a bundle allows, how each one is named, and how each one runs.

Row names (the --setups vocabulary), with ALG an algorithm of ours and K a draft length of --ks:

    ours-none                   our Pipeline, the target alone (the baseline of every ours-* row)
    ours-ALG-kK                 our speculative decoding, K drafted tokens per round (fixed)
                                (every ours row with a draft model first looks for the next tokens in the
                                prompt and output, as the runtime does by default, except the -nolookup one)
    ours-ALG-conf               the runtime's default: up to 8 drafted tokens, stopping after a token whose
                                draft probability (its top one) is under 0.7
    ours-ALG-conf-nolookup      the same without looking up the next tokens in the prompt and output first
                                (the draft model drafts every round; no free copies)
    ours-ALG-conf-guard         ours-ALG-conf with the drafting guard `auto` runs (a row names its algorithm, which
                                turns the guard off): the target alone while drafting loses; not a default row
    ours-ALG-POLICY             the same with an adaptive draft length, one row per adaptive draft policy of the
                                runtime (schedule: +2 after a fully accepted round, -1 otherwise; cost: the K
                                that maximizes measured tokens/s), starting at the smallest K
    ours-concurrent-ALG-...     from a second Pipeline(concurrent=True): the draft drafts the next round while
                                the target verifies, one CPU thread each (--concurrent)
    genai-none                  openvino_genai.LLMPipeline(bundle/target): GenAI's target alone
    genai-sd-kK                 LLMPipeline(bundle/target, draft_model=draft_model(bundle/draft)), K fixed
    genai-sd-conf               the same with GenAI's assistant_confidence_threshold = 0.7 (its own form of the
                                confidence stop)
    genai-sd-confC              the same with assistant_confidence_threshold C (--genai-confidences sweeps it)
    genai-ours-none, genai-ours-sd-kK  the same two GenAI pipelines with our CPU properties (--genai-ours)
                                (a bundle whose draft has another vocabulary gets GenAI rows with --genai-draft: GenAI
                                drafts with that bundle's same-vocabulary draft for the same target)
    hf-none                     transformers fp32 on CPU, the target's source folder, alone (--hf)
    hf-assisted                 transformers assisted generation with the draft (same vocabulary)      (--hf)
    hf-uag                      transformers Universal Assisted Generation (assistant_tokenizer) (other vocabulary)

ALG: standard for a same-vocabulary bundle; slem and tli for a different-vocabulary one; suffix always.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ..errors import EdgeSpecdecError
from .prompt_set import Prompt

ENGINES = ("ours", "genai", "genai-ours", "hf")
ENGINE_TITLES = {"ours": "edge-specdec", "genai": "OpenVINO GenAI (its default CPU properties)",
                 "genai-ours": "OpenVINO GenAI (our CPU properties)", "hf": "transformers fp32 (CPU)"}


@dataclass
class Spec:
    """A row before anything is loaded: what it is and whether it runs by default."""
    name: str
    engine: str
    description: str
    default: bool = True
    algorithm: str = "none"  # ours: Pipeline.generate(algorithm=...); genai: "none" or "sd"; hf: none/assisted/uag
    k: Optional[int] = None
    policy: str = "fixed"  # ours: the draft policy (fixed, or an adaptive one)
    confidence: float = 0.0  # stop drafting under this top probability (ours and GenAI; 0 = never)
    concurrent: bool = False
    lookup: bool = True  # ours, with a draft model: each round first looks for the next tokens in the text so far
    # ours: run the target alone while drafting loses to it (the drafting guard, which `auto` runs); None: the
    # algorithm's rule (off for an algorithm named, as every row names one)
    guard: Optional[bool] = None
    family: str = "core"  # the option that adds the row: core, genai, genai-ours, concurrent or hf

    @property
    def baseline(self) -> str:
        return f"{self.engine}-none"

    def speculative(self):
        """Our row's SpeculativeConfig (an ours row only). Rows neither read nor feed the draft pool: each run of a
        prompt is measured as a first request would run it, never copying an earlier row's answer."""
        from ..runtime.settings import SpeculativeConfig

        return SpeculativeConfig(algorithm=self.algorithm, num_assistant_tokens=self.k or 1,
                                 draft_policy=self.policy, confidence=self.confidence, lookup=self.lookup,
                                 pool_scope=None, guard=self.guard)


@dataclass
class Run:
    """One timed generation, engine-neutral."""
    text: str
    new_tokens: int
    wall_seconds: float
    token_ids: Optional[list[int]] = None  # ours only
    ttft_ms: Optional[float] = None
    tpot_ms: Optional[float] = None
    proposed: Optional[int] = None  # draft tokens proposed / accepted, where the engine reports them
    accepted: Optional[int] = None
    target_passes: Optional[int] = None
    rounds: Optional[int] = None  # ours: draft-verify rounds
    draft_seconds: Optional[float] = None
    target_seconds: Optional[float] = None
    loop_seconds: Optional[float] = None
    rss_start: Optional[int] = None  # bytes, whole process, filled in by the runner
    rss_peak: Optional[int] = None

    @property
    def tokens_per_s(self) -> float:
        """New tokens / wall seconds of the whole generate call (tokenizing, prefill and decoding): the same clock
        for every engine."""
        return self.new_tokens / self.wall_seconds if self.wall_seconds > 0 else 0.0


@dataclass
class Setup:
    spec: Spec
    run: Callable[[Prompt], Run]
    runs: dict = field(default_factory=dict)  # (prompt key, repeat) -> Run
    failures: list = field(default_factory=list)  # {"prompt", "repeat", "error"}

    @property
    def name(self) -> str:
        return self.spec.name


def adaptive_policies() -> tuple[str, ...]:
    """The runtime's adaptive draft-length policies."""
    from ..runtime.drafters import DRAFT_POLICIES

    return tuple(p for p in DRAFT_POLICIES if p != "fixed")


def genai_confidence_row(engine: str, confidence: float) -> str:
    """The name of GenAI's speculative row with assistant_confidence_threshold `confidence`: ENGINE-sd-conf for
    the usual 0.7, ENGINE-sd-conf0.3 for another."""
    from ..runtime.algorithms import CONFIDENCE

    return f"{engine}-sd-conf" if confidence == CONFIDENCE else f"{engine}-sd-conf{confidence:g}"


def candidate_specs(relation: str, ks: list[int], genai_ours: bool = False, concurrent: bool = False,
                    hf: bool = False, genai: bool = True, genai_confidences: Sequence[float] = (),
                    genai_draft: bool = False) -> list[Spec]:
    """Every row this bundle allows, in report order; `default` marks those a run without --setups includes.
    genai_confidences: GenAI's assistant_confidence_threshold values, one speculative row each (default: 0.7).
    genai_draft: GenAI drafts with another bundle's same-vocabulary draft, so its rows exist whatever the
    relation of this bundle's draft."""
    from ..runtime.algorithms import CONFIDENCE, DRAFT_TOKENS, REGISTRY, benchmark_algorithms

    same = relation == "identical"
    genai_drafts = same or genai_draft
    k0 = min(ks)
    specs = [Spec("ours-none", "ours", "our Pipeline, the target alone")]
    algorithms = benchmark_algorithms(relation)
    for prefix, is_concurrent in (("ours", False), ("ours-concurrent", True)):
        for alg in algorithms:
            if is_concurrent and not REGISTRY[alg].drafts_ahead:  # nothing to draft ahead: no model drafts
                continue
            what = f"{'concurrent ' if is_concurrent else ''}{alg}"
            on = concurrent or not is_concurrent  # the concurrent rows run by default only with --concurrent
            family = "concurrent" if is_concurrent else "core"
            specs += [Spec(f"{prefix}-{alg}-k{k}", "ours", f"ours, {what}, K={k} fixed", default=on, algorithm=alg,
                           k=k, concurrent=is_concurrent, family=family) for k in ks]
            if REGISTRY[alg].needs_draft:  # a draft model has probabilities to be unsure with
                specs.append(Spec(f"{prefix}-{alg}-conf", "ours", f"ours, {what}, up to K={DRAFT_TOKENS}, stops "
                                  f"under top probability {CONFIDENCE} (the runtime's default)", default=on,
                                  algorithm=alg, k=DRAFT_TOKENS, confidence=CONFIDENCE, concurrent=is_concurrent,
                                  family=family))
                specs.append(Spec(f"{prefix}-{alg}-conf-nolookup", "ours", f"ours, {what}, the runtime's default "
                                  f"without looking up the next tokens in the text first (the draft drafts every "
                                  f"round)", default=on, algorithm=alg, k=DRAFT_TOKENS, confidence=CONFIDENCE,
                                  concurrent=is_concurrent, lookup=False, family=family))
                if not is_concurrent:  # (a concurrent row drafts during the target's pass: no guard measures it)
                    specs.append(Spec(f"{prefix}-{alg}-conf-guard", "ours", f"ours, {what}, the runtime's default "
                                      f"with the drafting guard `auto` runs: the target alone while drafting loses, "
                                      f"measured as it runs (its verdict carries over to the next prompt)",
                                      default=False, algorithm=alg, k=DRAFT_TOKENS, confidence=CONFIDENCE,
                                      guard=True, family=family))
            specs += [Spec(f"{prefix}-{alg}-{policy}", "ours", f"ours, {what}, draft policy {policy} (first K={k0})",
                           default=on, algorithm=alg, k=k0, policy=policy, concurrent=is_concurrent,
                           family=family) for policy in adaptive_policies()]
    for engine, on in (("genai", genai), ("genai-ours", genai_ours)):
        props = "our CPU properties" if engine == "genai-ours" else "its default CPU properties"
        specs.append(Spec(f"{engine}-none", engine, f"OpenVINO GenAI LLMPipeline, the target alone, {props}",
                          default=on and genai_drafts, family=engine))
        if genai_drafts:
            specs += [Spec(f"{engine}-sd-k{k}", engine, f"OpenVINO GenAI speculative decoding, K={k}, {props}",
                           default=on, algorithm="sd", k=k, family=engine) for k in ks]
            specs += [Spec(genai_confidence_row(engine, c), engine, f"OpenVINO GenAI speculative decoding, "
                           f"assistant_confidence_threshold {c:g}, {props}", default=on, algorithm="sd",
                           confidence=c, family=engine)
                      for c in dict.fromkeys(genai_confidences or (CONFIDENCE,))]
    specs.append(Spec("hf-none", "hf", "transformers fp32, the target alone", default=hf, family="hf"))
    if same:
        specs.append(Spec("hf-assisted", "hf", "transformers assisted generation with the draft", default=hf,
                          algorithm="assisted", family="hf"))
    elif relation == "heterogeneous":
        specs.append(Spec("hf-uag", "hf", "transformers Universal Assisted Generation (assistant_tokenizer)",
                          default=hf, algorithm="uag", family="hf"))
    return specs


def select_specs(candidates: list[Spec], patterns: Optional[list[str]], relation: str,
                 add_families: Sequence[str] = ()) -> tuple[list[Spec], list[str]]:
    """The rows to run: the defaults, or those --setups names (exact names or shell patterns such as 'ours-*')
    plus the default rows of the optional families switched on (add_families: genai-ours, concurrent, hf).

    The target alone of every engine picked is always added: each row's speedup and output check need it.
    Returns the rows (in report order) and notes about what was added or left out.
    """
    notes = []
    if not patterns:
        chosen = {s.name for s in candidates if s.default}
    else:
        chosen = set()
        for pattern in patterns:
            hits = {s.name for s in candidates if fnmatchcase(s.name, pattern)}
            if not hits:
                raise EdgeSpecdecError(
                    f"unknown setup {pattern!r} for this bundle (vocabulary relation {relation!r}): choose from "
                    f"{', '.join(s.name for s in candidates)} (shell patterns such as 'ours-*' work too).")
            chosen |= hits
        chosen |= {s.name for s in candidates if s.family in add_families and s.default}
    for engine in ENGINES:
        base = f"{engine}-none"
        if any(s.engine == engine for s in candidates if s.name in chosen) and base not in chosen:
            chosen.add(base)
            notes.append(f"added {base}: the rows of {engine} are measured against it")
    return [s for s in candidates if s.name in chosen], notes


# --- our Pipeline -----------------------------------------------------------------------------------------------

def ours_runner(pipe, spec: Spec, max_new_tokens: int) -> Callable[[Prompt], Run]:
    from ..runtime import GenerationConfig
    from .compare import forget_prompt

    config = GenerationConfig(max_new_tokens=max_new_tokens).pinned()  # greedy, no penalty, whatever the bundle
    speculative = spec.speculative()

    def run(prompt: Prompt) -> Run:
        forget_prompt(pipe)  # each row prefills its whole prompt, as GenAI's rows (prefix cache off) do
        t = time.perf_counter()
        r = pipe.generate(prompt.ours, config, speculative)
        wall = time.perf_counter() - t
        if r.stop_reason == "interrupted":  # the Pipeline swallowed a Ctrl-C: hand it on to the runner
            raise KeyboardInterrupt
        st = r.stats.as_dict()
        # what the row proposed: the draft model's tokens and free copies alike
        proposed, accepted = (sum(st[f"{source}_tokens_{what}"] for source in ("draft", "suffix", "pool"))
                              for what in ("proposed", "accepted"))
        return Run(r.text, len(r.token_ids), wall, list(r.token_ids),
                   ttft_ms=1000 * st["first_token_seconds"], tpot_ms=st["time_per_output_token_ms"],
                   proposed=proposed, accepted=accepted,
                   target_passes=st["target_passes"], rounds=st["rounds"], draft_seconds=st["draft_seconds"],
                   target_seconds=st["target_seconds"], loop_seconds=st["loop_seconds"])
    return run


# --- OpenVINO GenAI ---------------------------------------------------------------------------------------------

def load_genai(bundle, engine: str, precision: str, need_sd: bool, draft_bundle=None) -> tuple[Any, Any, str]:
    """GenAI's target-only pipeline and (need_sd) its speculative one on the bundle's folders (the draft from
    draft_bundle when given: a bundle of the same target whose draft shares its vocabulary).

    Both get the same scheduler settings with the prefix cache off, so that every run pays its own prefill
    (the continuous-batching backend would otherwise reuse the previous run's prompt KV).
    Raises what GenAI raises; the caller turns that into a skipped row.
    """
    import openvino as ov
    import openvino_genai

    from ..runtime.devices import PROFILES
    from ..runtime.graph import int4_group_size

    def props(entry) -> dict[str, str]:  # genai-ours: the CPU settings our runtime gives this model
        if engine != "genai-ours":
            return {}
        return PROFILES["CPU"].precision_properties(precision,
                                                    int4_group_size(ov.Core().read_model(str(entry.model_xml))))
    target, target_props = str(bundle.target.folder), props(bundle.target)

    def scheduler():
        s = openvino_genai.SchedulerConfig()
        s.enable_prefix_caching = False
        return s
    alone = openvino_genai.LLMPipeline(target, "CPU", scheduler_config=scheduler(), **target_props)
    spec = None
    if need_sd:
        draft = (draft_bundle or bundle).draft
        drafter = openvino_genai.draft_model(str(draft.folder), "CPU", **props(draft))
        spec = openvino_genai.LLMPipeline(target, "CPU", draft_model=drafter, scheduler_config=scheduler(),
                                          **target_props)
    return alone, spec, openvino_genai.__version__


def genai_runner(pipe, spec: Spec, max_new_tokens: int) -> Callable[[Prompt], Run]:
    import openvino_genai

    config = openvino_genai.GenerationConfig()
    config.max_new_tokens = max_new_tokens
    config.do_sample = False
    config.apply_chat_template = False  # the prompt text is already rendered with the chat template (or raw)
    if spec.confidence:
        config.assistant_confidence_threshold = spec.confidence
    elif spec.k is not None:
        config.num_assistant_tokens = spec.k

    def run(prompt: Prompt) -> Run:
        t = time.perf_counter()
        r = pipe.generate([prompt.text], config)
        wall = time.perf_counter() - t
        pm = r.perf_metrics
        out = Run(r.texts[0], pm.get_num_generated_tokens(), wall, ttft_ms=pm.get_ttft().mean,
                  tpot_ms=pm.get_tpot().mean)
        ext = getattr(r, "extended_perf_metrics", None)
        if ext is not None and hasattr(ext, "get_num_accepted_tokens"):
            out.accepted, out.proposed = ext.get_num_accepted_tokens(), ext.get_num_draft_tokens()
            out.target_passes = len(ext.main_model_metrics.raw_metrics.m_batch_sizes) or None
        return out
    return run


# --- Hugging Face transformers ----------------------------------------------------------------------------------

def load_hf(manifest: dict, side: str):
    """(model, tokenizer) from the source the bundle was exported from; raises EdgeSpecdecError with the reason."""
    source = manifest.get(side, {}).get("source", {})
    given, kind = source.get("given"), source.get("kind")
    if not given:
        raise EdgeSpecdecError(f"the manifest records no source for the {side}")
    if kind == "gguf" or str(given).endswith(".gguf"):
        raise EdgeSpecdecError(f"the {side}'s source {given} is a GGUF file, not a Hugging Face folder")
    if kind == "local" and not Path(given).is_dir():
        raise EdgeSpecdecError(f"the {side}'s source folder {given} is missing")
    try:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise EdgeSpecdecError(f"transformers/torch not importable ({exc}); pip install 'edge-specdec[export]'")
    transformers.logging.set_verbosity_error()  # its warnings and progress bars would drown the progress lines
    transformers.logging.disable_progress_bar()
    try:  # never download: a hub id works only if it is in the local Hugging Face cache
        model = AutoModelForCausalLM.from_pretrained(given, dtype=torch.float32, local_files_only=True).eval()
        tokenizer = AutoTokenizer.from_pretrained(given, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - any loading problem becomes the row's skip reason
        raise EdgeSpecdecError(f"transformers cannot load the {side} from {given}: {type(exc).__name__}: "
                               f"{str(exc)[:200]}") from None
    return model, tokenizer


class _FirstTokenClock:
    """A transformers streamer that notes when the first generated tokens arrive (the first put() is the prompt)."""

    def __init__(self):
        self.calls, self.first = 0, None

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2 and self.first is None:
            self.first = time.perf_counter()

    def end(self) -> None:
        pass


def hf_runner(target, tokenizer, spec: Spec, max_new_tokens: int, draft=None, draft_tokenizer=None
              ) -> Callable[[Prompt], Run]:
    import torch

    bos = tokenizer.bos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    kwargs: dict[str, Any] = dict(max_new_tokens=max_new_tokens, do_sample=False, temperature=None, top_p=None,
                                  top_k=None, repetition_penalty=1.0, pad_token_id=pad)
    if spec.algorithm == "assisted":
        kwargs.update(assistant_model=draft)
    elif spec.algorithm == "uag":
        kwargs.update(assistant_model=draft, tokenizer=tokenizer, assistant_tokenizer=draft_tokenizer)

    def run(prompt: Prompt) -> Run:
        ids = tokenizer(prompt.text)["input_ids"]
        if bos is not None and ids[:2] == [bos, bos]:  # as pipe.chat_prompt: the template wrote BOS, so did we
            ids = ids[1:]
        input_ids = torch.tensor([ids])
        clock = _FirstTokenClock()
        t = time.perf_counter()
        with torch.inference_mode():
            out = target.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), streamer=clock,
                                  **kwargs)
        end = time.perf_counter()
        new = out[0, len(ids):]
        n = len(new)
        ttft = None if clock.first is None else 1000 * (clock.first - t)
        tpot = None if ttft is None or n < 2 else (1000 * (end - t) - ttft) / (n - 1)
        return Run(tokenizer.decode(new, skip_special_tokens=True), n, end - t, ttft_ms=ttft, tpot_ms=tpot)
    return run
