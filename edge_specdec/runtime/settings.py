"""The settings of an Engine and of a request's speculative decoding, each a frozen object checked once, when built;
and the one way generate()'s keyword arguments become a request's configs (generate_configs).

    from edge_specdec.runtime import EngineConfig, GenerationConfig, Pipeline, SpeculativeConfig
    pipe = Pipeline("bundles/qwen", config=EngineConfig(target_device="CPU", draft_device="GPU"))
    pipe.generate("def fib(n):", GenerationConfig(max_new_tokens=64), SpeculativeConfig(algorithm="slem"))

Three objects, one per concern: `EngineConfig`, how a bundle is loaded and run (fixed for the Engine's life);
`GenerationConfig` (sampling.py), what the request generates (the sampling and stopping that decide the output);
`SpeculativeConfig`, how fast it gets there (the algorithm and its drafting, which never change the output of a
bit-exact session). Every front end (the Python API, the CLI, the server, the benchmark) builds these and hands
them down; a wrong value is refused here, in one line that names the field and the fix.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass, fields
from numbers import Integral, Real
from pathlib import Path
from typing import Any, Optional, Union

from ..errors import EdgeSpecdecError
from .algorithms import ALGORITHMS, AUTO, CONFIDENCE, LOOKUP_FIRST, Algorithm
from .batching import MAX_WAIT
from .devices import KV_CACHES, LONG_PROMPT_PRECISIONS, NPU_MAX_PROMPT, PRECISIONS
from .draft_window import DRAFT_WINDOW, MIN_WINDOW
from .drafters import DRAFT_POLICIES
from .sampling import GenerationConfig
from .session import ROLLBACK_METHODS
from .suffix import DRAFT_POOL_TOKENS

# the draft proposes from its first DRAFT_VOCAB token ids (and its special tokens) unless told otherwise
DRAFT_VOCAB = 65536
# a model whose weights are smaller than this runs on one CPU thread unless told otherwise: it sits in the caches and
# its layers are narrow, so barriers between threads cost more than they share
SMALL_MODEL_BYTES = 32 * 2**20
# a model whose weights are smaller than this gets static copies unless told otherwise (see CompiledLM.add_static);
# each copy holds the weights again
STATIC_MAX_BYTES = 256 * 2**20
# with batching, sessions draft their full length only while at most DRAFT_MAX_SESSIONS generate; with more, at
# most CROWDED_DRAFT_TOKENS each (0: the target's own tokens, verified together). A batched pass costs by its rows,
# and a draft that shares the target's cores costs every session its calls (benchmarks/RESULTS.md, "Concurrent
# clients"); with the draft on a device of its own, 1 drafted token (in the row a step of the target alone
# re-feeds anyway) can pay.
DRAFT_MAX_SESSIONS = 2
CROWDED_DRAFT_TOKENS = 0


@dataclass(frozen=True)
class EngineConfig:
    """How an Engine loads a bundle and runs its models. The output is the same whatever these say, except
    precision and kv_rollback, which choose the arithmetic both the target alone and speculation then share."""
    target_device: str = "AUTO"           # CPU, GPU, GPU.N, NPU or AUTO (a discrete GPU if any, else the CPU)
    # the same for the draft; AUTO: an integrated GPU or the NPU if any, its step timed against the CPU's once per
    # machine and bundle and the faster kept (devices.measure_draft_device)
    draft_device: str = "AUTO"
    allow_fallback: bool = False          # a device asked for but absent runs on the CPU instead of failing
    verify_checksums: bool = True         # check every file's sha256 at each load (False: sizes only)
    # OpenVINO's compiled-model cache (None: $EDGE_SPECDEC_CACHE_DIR or ~/.cache/edge-specdec/ov-cache; "off": none)
    cache_dir: Union[str, Path, None] = None
    precision: str = "dq"                 # CPU arithmetic (devices.PRECISIONS): dq, dynamic int8 activations; f32
    # the KV cache's element type (devices.KV_CACHES: f32, f16, u8; None: the device's, f16 on the CPU). u8 takes about
    # a quarter of f32's memory but is not block-invariant: runs on it are exact only up to float noise (Result.exact)
    kv_cache: Optional[str] = None
    # prefill prompts of at least session.SEQUENCES_AFTER tokens on a copy of the target at this precision
    # (devices.LONG_PROMPT_PRECISIONS; "bf16": about 0.6x dq's time on CPUs with AMX, the copy holding the target's
    # weights again; "auto": bf16 where that pays, measured once per machine; "off": on the target as every other
    # call). Exact like dq: the target alone and every algorithm prefill alike (session.py, "A long prompt's prefill
    # in bf16")
    long_prompt_precision: str = "auto"
    kv_rollback: Optional[str] = None     # how a KV cache forgets rejected tokens (see open_model); None: the device's
    concurrent: Optional[bool] = None     # draft while the target verifies; None: when they sit on different devices
    # the draft computes logits for its first draft_vocab token ids and its special tokens only, so it proposes only
    # those: a smaller output layer, a faster step (0: its whole vocabulary)
    draft_vocab: int = DRAFT_VOCAB
    # OpenVINO CPU threads per model (None: one for a model under SMALL_MODEL_BYTES, half of the cores each when the
    # two run at once on one CPU, else all)
    threads: Optional[int] = None
    # widen the short blocks of speculation to one size per model, so the device keeps one shape (None: where
    # probes.fixed_block_pays measures that it wins; see Engine.block_shapes)
    fixed_blocks: Optional[bool] = None
    # copies for the block sizes a model runs most, each compiled when a request first calls its size, not at load
    # (None: for models under STATIC_MAX_BYTES; `run` turns them off: they pay back their compile over many
    # requests, not over one run)
    static_shapes: Optional[bool] = None
    batching: bool = False                # sessions verify their blocks together in one call (batching.py)
    batch_wait: float = MAX_WAIT          # seconds a batched call waits for the other sessions' calls
    # with batching, a session drafts its full length only while at most this many sessions generate (None: always)
    draft_max_sessions: Optional[int] = DRAFT_MAX_SESSIONS
    crowded_draft_tokens: int = CROWDED_DRAFT_TOKENS  # the most a session drafts per round beyond that (0: none)
    npu_max_prompt: int = NPU_MAX_PROMPT  # the longest prompt a model on the NPU is compiled for (npu.py)
    # a session keeps its KV caches between runs and prefills only what the next prompt does not share with them
    prefix_reuse: bool = True
    # run each model once at load, so that what OpenVINO prepares on a model's first inference is part of the load
    # and not of the first request (Engine._warm_up)
    warm_up: bool = True
    # the draft pool: earlier requests' prompts and outputs, for free drafts (suffix.py), at most this many tokens
    # over all scopes, in memory; 0: no pool (free drafts still copy from each request's own text)
    draft_pool_tokens: int = DRAFT_POOL_TOKENS
    # a Jinja chat template file to render conversations with instead of the bundle's (llama-server's
    # --chat-template-file); the bundle's files and checksums stay as they are
    chat_template: Union[str, Path, None] = None

    def __post_init__(self):
        for name in ("target_device", "draft_device"):
            _check(isinstance(getattr(self, name), str) and getattr(self, name).strip() != "", name,
                   "a device name: CPU, GPU, GPU.N, NPU or AUTO", getattr(self, name))
        for name in ("allow_fallback", "verify_checksums", "batching", "prefix_reuse", "warm_up"):
            _check(isinstance(getattr(self, name), bool), name, "True or False", getattr(self, name))
        for name in ("concurrent", "fixed_blocks", "static_shapes"):
            _check(getattr(self, name) is None or isinstance(getattr(self, name), bool), name,
                   "True, False or None (chosen per machine)", getattr(self, name))
        _check(self.precision in PRECISIONS, "precision", f"one of {', '.join(PRECISIONS)}", self.precision)
        _check(self.kv_cache is None or self.kv_cache in KV_CACHES, "kv_cache",
               f"one of {', '.join(KV_CACHES)}, or None (the device's own)", self.kv_cache)
        _check(self.long_prompt_precision in LONG_PROMPT_PRECISIONS, "long_prompt_precision",
               f"one of {', '.join(LONG_PROMPT_PRECISIONS)}", self.long_prompt_precision)
        _check(self.kv_rollback is None or self.kv_rollback in ROLLBACK_METHODS, "kv_rollback",
               f"one of {', '.join(ROLLBACK_METHODS)}, or None (the device's own)", self.kv_rollback)
        _check(_whole(self.draft_vocab, 0), "draft_vocab", "0 (the whole vocabulary) or a number of token ids",
               self.draft_vocab)
        _check(self.threads is None or _whole(self.threads, 1), "threads", "at least 1, or None (chosen per model)",
               self.threads)
        _check(_number(self.batch_wait) and self.batch_wait >= 0, "batch_wait", "0 or more seconds", self.batch_wait)
        _check(self.draft_max_sessions is None or _whole(self.draft_max_sessions, 1), "draft_max_sessions",
               "at least 1, or None (always the full length)", self.draft_max_sessions)
        _check(_whole(self.crowded_draft_tokens, 0), "crowded_draft_tokens", "0 (the target alone) or more",
               self.crowded_draft_tokens)
        _check(_whole(self.npu_max_prompt, 1), "npu_max_prompt", "at least 1 token", self.npu_max_prompt)
        _check(_whole(self.draft_pool_tokens, 0), "draft_pool_tokens", "0 (no pool) or a number of tokens",
               self.draft_pool_tokens)
        _check(self.chat_template is None or (isinstance(self.chat_template, (str, Path))
                                              and str(self.chat_template).strip() != ""),
               "chat_template", "the path of a Jinja chat template file, or None (the bundle's)", self.chat_template)

    @classmethod
    def of(cls, config: Optional["EngineConfig"], settings: dict[str, Any]) -> "EngineConfig":
        """The one way keyword arguments become an EngineConfig: `Engine(bundle, target_device="CPU")` is
        `Engine(bundle, config=EngineConfig(target_device="CPU"))`. Both at once is refused."""
        return _given_or_built(cls, config, settings, "the engine's settings", "config=EngineConfig(...)",
                               "Engine setting")


@dataclass(frozen=True)
class SpeculativeConfig:
    """How one request drafts: the algorithm, how much it drafts per round, and when it stops drafting. Per request
    (the server lets each request choose); its defaults are the algorithm's (algorithms.REGISTRY)."""
    algorithm: str = AUTO                 # one of algorithms.ALGORITHMS; auto: the registry's choice for the bundle
    # the most tokens drafted per round (the first length of an adaptive policy); None: the algorithm's own
    num_assistant_tokens: Optional[int] = None
    # fixed; schedule: +2 after a fully accepted round, -1 otherwise; cost: the length that maximizes the measured
    # tokens per second (drafters.DraftLength)
    draft_policy: str = "fixed"
    # a draft model stops drafting after a token whose top probability is under it (None: algorithms.CONFIDENCE;
    # 0: it drafts num_assistant_tokens every round)
    confidence: Optional[float] = None
    # a draft model's round first tries a free copy of text the target has seen: the request's own and, with a
    # pool, earlier requests' (sources.FreeFirst); False: the draft model drafts every round
    lookup: bool = LOOKUP_FIRST
    # the part of the engine's draft pool this request reads and adds to (a server's API key): requests of one scope
    # never see another's text; None: this request neither reads the pool nor adds to it
    pool_scope: Optional[str] = ""
    # run the target alone while drafting loses to it, measured as the run goes (drafters.DraftingGuard); None: on
    # for auto unless the run is seeded sampling, whose text would then depend on the clock
    guard: Optional[bool] = None
    # the most tokens the draft model reads: a longer sequence (prompt and output so far) is read through a window,
    # its head and its last tokens, which slides in large steps (draft_window.py); the target still verifies every
    # token. None: draft_window.DRAFT_WINDOW tokens, or the draft's context if shorter (on the NPU, the prompt it was
    # compiled for: pipeline.draft_room); 0: no window (the draft reads the whole sequence, and stops drafting once
    # it outgrows the draft's context)
    draft_window: Optional[int] = None
    # False: no drafting decision reads the clock, so the rounds depend on the request alone: free copies are
    # paused by their acceptance (as in a seeded sampled run), the cost policy prices rounds by the weights'
    # sizes, and there is no guard (`edge-specdec pair` replays runs this way, with a target that costs nothing)
    clock: bool = True

    def __post_init__(self):
        _check(self.algorithm in ALGORITHMS, "algorithm", f"one of {', '.join(ALGORITHMS)}", self.algorithm)
        _check(self.num_assistant_tokens is None or _whole(self.num_assistant_tokens, 1), "num_assistant_tokens",
               "a whole number of at least 1, or None (the algorithm's default)", self.num_assistant_tokens)
        _check(self.draft_policy in DRAFT_POLICIES, "draft_policy", f"one of {', '.join(DRAFT_POLICIES)}",
               self.draft_policy)
        _check(self.confidence is None or (_number(self.confidence) and 0.0 <= self.confidence < 1.0), "confidence",
               "at least 0 and below 1 (0 = never stop drafting early)", self.confidence)
        _check(isinstance(self.lookup, bool), "lookup", "True or False", self.lookup)
        _check(self.pool_scope is None or isinstance(self.pool_scope, str), "pool_scope",
               "a string, or None (no pool)", self.pool_scope)
        _check(self.guard is None or isinstance(self.guard, bool), "guard", "True, False or None (on for auto)",
               self.guard)
        _check(self.draft_window is None or (_whole(self.draft_window, 0)
                                             and (self.draft_window == 0 or self.draft_window >= MIN_WINDOW)),
               "draft_window", f"0 (no window), at least {MIN_WINDOW} tokens, or None (the default window)",
               self.draft_window)
        _check(isinstance(self.clock, bool), "clock", "True or False", self.clock)
        _check(self.clock or not self.guard, "guard", "False or None when clock is False (the guard measures the "
               "clock)", self.guard)

    def draft_tokens(self, algorithm: Algorithm) -> int:
        """The most tokens a round drafts with this algorithm: num_assistant_tokens, else the algorithm's own."""
        return algorithm.draft_tokens if self.num_assistant_tokens is None else self.num_assistant_tokens

    def confidence_stop(self) -> float:
        """The top probability under which a draft model stops drafting: confidence, else algorithms.CONFIDENCE."""
        return CONFIDENCE if self.confidence is None else self.confidence

    def window_tokens(self, draft_context: Optional[int]) -> Optional[int]:
        """The draft's window in tokens for a draft of this context (None: no bound known): draft_window, else
        DRAFT_WINDOW, never more than the context; None for no window (draft_window 0, or a context shorter than
        draft_window.MIN_WINDOW)."""
        if self.draft_window == 0:
            return None
        size = DRAFT_WINDOW if self.draft_window is None else self.draft_window
        size = size if draft_context is None else min(size, draft_context)
        return size if size >= MIN_WINDOW else None  # a context too short for a window: the whole sequence


def generate_configs(config: Optional[GenerationConfig], speculative: Optional[SpeculativeConfig],
                     settings: dict[str, Any]) -> tuple[Optional[GenerationConfig], SpeculativeConfig]:
    """The one way generate()'s keyword arguments become its two configs, as OpenVINO GenAI's generate takes them:
    GenerationConfig's fields (`generate(p, max_new_tokens=64)` is `generate(p, GenerationConfig(max_new_tokens=64))`)
    and SpeculativeConfig's (`generate(p, algorithm="slem")`); beside a config, they override its fields. The
    generation config comes back checked (GenerationConfig.validate), None where neither was given."""
    generation = {name: value for name, value in settings.items() if name in GENERATION_FIELDS}
    drafting = {name: value for name, value in settings.items() if name not in GENERATION_FIELDS}
    for name in drafting:
        if name not in SPECULATIVE_FIELDS:
            raise TypeError(unknown_argument(name))
    if config is not None or generation:
        if config is not None:  # the fields the config set, then the keywords: the others still take the bundle's
            generation = {**{name: getattr(config, name) for name in config.fields_set}, **generation}
        config = GenerationConfig(**generation).validate()
    if speculative is not None and drafting:
        return config, dataclasses.replace(speculative, **drafting)
    return config, speculative if speculative is not None else SpeculativeConfig(**drafting)


def unknown_argument(name: str) -> str:
    """The error for a generate() keyword that is no argument of it: what was probably meant (a name GenAI, Hugging
    Face or OpenAI's API gives it, or a close spelling), then what it takes."""
    meant = GENERATE_ALIASES.get(name) or next(iter(difflib.get_close_matches(name, sorted(GENERATE_ARGUMENTS), 1)),
                                               None)
    return (f"unknown generate() argument {name!r}" + (f": did you mean {meant}?" if meant else ".")
            + " It takes a GenerationConfig's and a SpeculativeConfig's fields as keywords, and config, speculative, "
              "on_text, on_prefill, cancel and record_target_calls.")


GENERATION_FIELDS = frozenset(f.name for f in fields(GenerationConfig))
SPECULATIVE_FIELDS = frozenset(f.name for f in fields(SpeculativeConfig))
# generate()'s arguments that are not a config's field
GENERATE_CALL_OPTIONS = frozenset({"config", "speculative", "on_text", "on_prefill", "cancel", "record_target_calls"})
GENERATE_ARGUMENTS = GENERATION_FIELDS | SPECULATIVE_FIELDS | GENERATE_CALL_OPTIONS
# other tools' names for generate()'s arguments
GENERATE_ALIASES = {"generation_config": "config", "streamer": "on_text (a callable that gets each piece of text)",
                    "max_tokens": "max_new_tokens", "max_length": "max_new_tokens (it counts the new tokens only)",
                    "stop": "stop_strings", "eos_token_id": "eos_token_ids (a list)", "rng_seed": "seed",
                    "do_sample": "temperature (0 is greedy, the default)"}


def _whole(value: Any, least: int) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool) and value >= least


def _number(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


def _check(ok: bool, name: str, wanted: str, value: Any) -> None:
    if not ok:
        raise EdgeSpecdecError(f"{name} must be {wanted}, not {value!r}.")


def _given_or_built(cls, given, settings: dict[str, Any], what: str, as_object: str, argument: str):
    """The config given, or one built from keyword arguments (the two ways a caller passes settings); both at once,
    or a keyword that is no field, is refused."""
    if given is not None and settings:
        raise EdgeSpecdecError(f"give {what} either as {as_object} or as keyword arguments, not both "
                               f"({', '.join(sorted(settings))} beside it).")
    unknown = sorted(set(settings) - {f.name for f in fields(cls)})
    if unknown:
        raise TypeError(f"unknown {argument} {unknown[0]!r}: {cls.__name__}'s fields are "
                        f"{', '.join(f.name for f in fields(cls))}.")
    return given if given is not None else cls(**settings)
