"""The Python API: load a bundle once, generate many times, from one thread or many.

    from edge_specdec.runtime import Pipeline, GenerationConfig
    pipe = Pipeline("bundles/qwen")
    result = pipe.generate("def fib(n):", GenerationConfig(max_new_tokens=64))
    print(result.text, result.stats.tokens_per_s)
    for piece in pipe.stream("def fib(n):"):            # or generate(..., on_text=callback)
        print(piece, end="", flush=True)

An `Engine` holds what is loaded once: the bundle, the placement, the compiled models with their static copies
(each compiled by the first request that calls its size), the tokenizers, the vocabulary map and its measurement cache. A
`DecodingSession` (`engine.session()`) holds one request's KV caches and infer requests, nothing else: N sessions
decode in N threads with the weights held once.
A `Pipeline` is an Engine with one session of its own, whose calls run one at a time (a lock; a second thread
waits): the simple API. For parallel generation, give each thread `pipe.session()`, or give `pipe.generate` a list
of prompts.
"""
from __future__ import annotations

import asyncio
import dataclasses
import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from functools import cached_property, partial
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterator, Optional, Sequence, Union

import numpy as np
import openvino as ov

from ..bundle import MANIFEST_FILE, Bundle, load_bundle, start_verification
from ..demo import DEMO_BUNDLE
from ..errors import BundleError, EdgeSpecdecError
from ..vocab_map import TokenBytes
# DRAFT_TOKENS: the default draft length, read here by callers that size blocks for it
from .algorithms import (AUTO, DRAFT_TOKENS, REGISTRY, Algorithm, DraftContext,  # noqa: F401
                         available, resolve)
from .batching import Scheduler, batch_invariant
from .draft_window import ChatHead, chat_head_length
from .drafters import DraftingGuard, DraftLength
from .generate import PrefillProgress, Result, generate
from .grammar import GrammarTokenizer
from .tool_calls import ToolFormat, tool_format
from .retokenize import Retokenizer
from .sampling import GenerationConfig
from .chat import ChatTemplate, special_token_texts
from .conversation import Conversation
from .devices import (DRAFT_GENERATION_TOKENS, TARGET_GENERATION_TOKENS, Placement, check_npu_weights,
                      compile_config, list_devices, measure_draft_device, place, resolve_cache_dir)
from .measurements import MeasurementCache, machine_key
from .probes import cheapest_step, fixed_block_pays, is_block_invariant, step_seconds
from .session import CALL_LAYOUT, SEQUENCES_AFTER, BlockPool, ModelSession, open_model
from .sources import FreeFirst
from .spare_memory import releasing_mapped
from .suffix import DraftPool
from .settings import (GENERATE_CALL_OPTIONS, SMALL_MODEL_BYTES, STATIC_MAX_BYTES, EngineConfig, SpeculativeConfig,
                       generate_configs)
from .text import PromptTokenizer, TextStream, decode

DRAFT_BLOCK = 4  # a draft's calls (a sync of a few tokens, then single steps) widened to this many tokens
# Pipeline.generate over several prompts runs at most this many at once, each on a session of its own (each holds KV
# caches and infer requests); the others wait for a free session
SESSIONS_AT_ONCE = 8
WARM_UP_BLOCK = 8  # the block a model runs at load before its single step: a short prompt's (Engine._warm_up)


class Engine:
    """A loaded bundle: the target (and draft) compiled on their devices once, shared by every session.

    bundle: a bundle folder (or a loaded Bundle); None: the demo pair that ships inside the package.
    default_config: the GenerationConfig of the defaults the bundle's manifest records (the demo's: a repetition
    penalty of 1.2); a request's config takes them for the fields it leaves unset.
    config: how the engine loads and runs (an EngineConfig, whose fields say what each one does); its fields may be
    given as keyword arguments instead, `Engine(bundle, target_device="CPU")`. core: the OpenVINO Core to compile on.

    With verify_checksums, the sha256 of every file of the bundle (a Bundle object's too) is checked at every load,
    in a thread while the models compile (bundle.start_verification), and a file that does not match is refused
    (BundleError, the words of `edge-specdec info`) before the Engine exists, so nothing is ever generated from
    damaged or tampered weights. `placement.describe()` says what runs where and why; `batching_note` whether the
    sessions verify together. The draft vocabulary cut costs little acceptance (byte-level BPE and unigram
    tokenizers number their tokens roughly from frequent to rare) and makes a draft with a large vocabulary faster.
    Whatever the settings, the target decides every token.
    """

    def __init__(self, bundle: Union[str, Path, Bundle, None] = None, config: Optional[EngineConfig] = None, *,
                 core: Optional[ov.Core] = None, **settings):
        start = time.perf_counter()
        self.config = config = EngineConfig.of(config, settings)
        if bundle is None:  # the demo pair that ships inside the package
            bundle = DEMO_BUNDLE
        self.bundle = bundle if isinstance(bundle, Bundle) else load_bundle(bundle, verify=False)  # sizes
        verification = start_verification(self.bundle) if config.verify_checksums else None  # hashed while compiling
        self.default_config = bundle_defaults(self.bundle)
        self.core = core or ov.Core()
        cache = resolve_cache_dir(config.cache_dir)
        self.placement = self._place(list_devices(self.core), cache)
        same_device = self.placement.target == self.placement.draft
        self.concurrent = bool(self.bundle.draft) and (not same_device if config.concurrent is None
                                                       else config.concurrent)
        self._open_models(cache)
        self._block_shapes: dict[tuple[int, bool], dict[str, int]] = {}  # see block_shapes
        self._static = {role: weight_bytes(model) < STATIC_MAX_BYTES if config.static_shapes is None
                        else config.static_shapes for role, model in self._bundle_models()}
        static_sizes = self._static_sizes()  # measured at load; each copy compiled by the first request that calls it
        if config.warm_up:
            self._warm_up()
        self.tokenizer = PromptTokenizer(self.bundle.target.tokenizer_xml, self.core)
        if config.chat_template is not None:  # a template file given is read, or refused, at load
            _ = self.chat_template
        if verification is not None:
            verification.wait()  # a file that does not match its checksum raises here, before any generation
        self.load_seconds = time.perf_counter() - start  # checksums, compiles, checks: all of the load
        self.target_retokenizer = Retokenizer(self.tokenizer.encode, self.vocab_map.target)
        # earlier requests' prompts and outputs, for free drafts (suffix.py); shared by every session
        self.draft_pool = DraftPool(config.draft_pool_tokens) if config.draft_pool_tokens else None
        self.scheduler, self.pools, self.batching_note = None, {}, ""
        if config.batching:
            self._start_batching(config.batch_wait)
        self._plan_static_copies(static_sizes)
        if self.draft_model is not None and (self.draft_model.static or self.draft_model.planned):
            self.guard_scope = "/draft-copies"

    @property
    def long_prompt_note(self) -> str:
        """What long_prompt_precision came to (session.py, "A long prompt's prefill in bf16"): the precision long
        prompts are prefilled at, else why they are not when a precision was asked for, else ("off", or "auto"
        finding that a copy would not pay) ""; `check` shows auto's reason."""
        model = self.target_model
        if model.prefill is not None:
            return f"prompts of {SEQUENCES_AFTER}+ tokens prefilled at {model.prefill_precision}"
        return "" if self.config.long_prompt_precision in ("off", "auto") else model.prefill_note

    def _bundle_models(self) -> list[tuple[str, Any]]:
        """The bundle's models by role: the target, and the draft if it has one."""
        return [(role, model) for role, model in (("target", self.bundle.target), ("draft", self.bundle.draft))
                if model]

    def _npu(self, role: str) -> dict[str, int]:
        """open_model's NPU settings for a role: the longest prompt, and the tokens of a generate call (npu.py)."""
        tokens = TARGET_GENERATION_TOKENS if role == "target" else DRAFT_GENERATION_TOKENS
        return dict(npu_max_prompt=self.config.npu_max_prompt, npu_generation_tokens=tokens)

    def _place(self, devices: list, cache: Optional[Path]) -> Placement:
        """The devices of the target and the draft (see devices.place). With draft_device AUTO and an accelerator
        present, the draft's step is timed on each candidate device (the CPU among them) once per machine and
        bundle, and the fastest wins (devices.measure_draft_device)."""
        config, draft = self.config, self.bundle.draft
        placement = place(devices, config.target_device, config.draft_device if draft else None,
                          config.allow_fallback)
        if draft and (config.draft_device or "").strip().upper() == "AUTO" and placement.draft != "CPU":
            def draft_step_ms(device: str) -> float:
                model = open_model(draft.model_xml, device, core=self.core, block_invariant=False,
                                   config=compile_config(device, cache, config.threads or 1), **self._npu("draft"))
                return 1000 * step_seconds(model.session())

            key = {"openvino": ov.get_version(), "machine": machine_key(self.core), "bundle": self.bundle.manifest.get(
                "files"), "devices": [vars(d) for d in devices], "npu_max_prompt": config.npu_max_prompt}
            placement = measure_draft_device(placement, devices, draft_step_ms, MeasurementCache(cache, key))
        if draft and placement.draft.startswith("NPU"):
            check_npu_weights(draft.info)
        return placement

    def _cpu_threads(self, model) -> Optional[int]:
        """OpenVINO CPU threads for a bundle model: EngineConfig.threads, else one for a model under
        SMALL_MODEL_BYTES, half of the cores when the two models run at once on one CPU, else all (None)."""
        if self.config.threads:
            return self.config.threads
        if weight_bytes(model) < SMALL_MODEL_BYTES:
            return 1
        # two models on one CPU at the same time: give each half of the cores
        shared = self.concurrent and self.placement.target == self.placement.draft
        return max(1, (os.cpu_count() or 2) // 2) if shared else None

    def _open_models(self, cache: Optional[Path]) -> None:
        """Compile the target and the draft on their devices (the two compiles overlap: OpenVINO releases the GIL
        while it compiles), with the MeasurementCache that keeps what it measured of them on this machine."""
        config, target, draft = self.config, self.bundle.target, self.bundle.draft
        configs = {role: compile_config(getattr(self.placement, role), cache, self._cpu_threads(model))
                   for role, model in self._bundle_models()}
        self.measurements = MeasurementCache(cache, {
            "bundle": self.bundle.manifest.get("files"), "openvino": ov.get_version(),
            "machine": machine_key(self.core), "placement": vars(self.placement), "precision": config.precision,
            "rollback": config.kv_rollback, "kv_cache": config.kv_cache, "configs": configs,
            "draft_vocab": config.draft_vocab, "call_layout": CALL_LAYOUT})
        known = dict(self.measurements.known("target/invariant") or {})  # exactness per precision, from the cache
        longest = dict(self.measurements.known("target/longest_block") or {})  # the longest exact call, the same
        sequences = dict(self.measurements.known("target/sequences") or {})  # the one-token-sequences layout's
        prefill = dict(self.measurements.known("target/prefill") or {})  # the long-prompt prefill copy's
        prefill_ratio = dict(self.measurements.known("target/prefill_ratio") or {})  # auto's timing of it
        checked_before, longest_before, sequences_before = dict(known), dict(longest), dict(sequences)
        prefill_before, prefill_ratio_before = dict(prefill), dict(prefill_ratio)
        self.vocab_map = self.bundle.load_vocab_map()
        common = dict(core=self.core, precision=config.precision, rollback=config.kv_rollback,
                      kv_cache=config.kv_cache)
        with ThreadPoolExecutor(1, thread_name_prefix="load-draft") as pool:
            draft_job = draft and pool.submit(
                open_model, draft.model_xml, self.placement.draft, **common, block_invariant=False,
                output_ids=draft_output_ids(self.vocab_map.draft, config.draft_vocab),
                max_context=draft.info.get("max_position_embeddings"), config=configs["draft"], **self._npu("draft"))
            self.target_model = open_model(target.model_xml, self.placement.target, **common,
                                           max_context=target.info.get("max_position_embeddings"),
                                           config=configs["target"], known_invariant=known,
                                           known_longest=longest, known_sequences=sequences,
                                           prefill_precision=None if config.long_prompt_precision == "off" else
                                           config.long_prompt_precision, known_prefill=prefill,
                                           known_prefill_ratio=prefill_ratio,
                                           **self._npu("target"))
            self.draft_model = draft_job.result() if draft_job else None
        if longest != longest_before:  # written before the verdicts measured with it
            self.measurements.put("target/longest_block", longest)
        if known != checked_before:  # open_model checked a precision on this machine for the first time
            self.measurements.put("target/invariant", known)
        if sequences != sequences_before:
            self.measurements.put("target/sequences", sequences)
        if prefill != prefill_before:
            self.measurements.put("target/prefill", prefill)
        if prefill_ratio != prefill_ratio_before:
            self.measurements.put("target/prefill_ratio", prefill_ratio)

    def _warm_up(self) -> None:
        """Run each model on a scratch session: a block as long as a short prompt and a single step (a static copy
        runs once before it serves: CompiledLM.add_static). OpenVINO prepares a compiled model on its first
        inference (the CPU plugin repacks the weights then, which takes seconds for a 1.5B target and happens in
        every process: no cache keeps it), and again on the first call of each kind of block (its short blocks run
        other kernels than its long ones). Done here, that work is part of the load, where `load_seconds` and the
        progress line count it, and not of the first request. The NPU's pipeline prepares itself when it
        compiles."""
        for model in (self.target_model, self.draft_model):
            if model is None or model.rollback_method == "npuw":
                continue
            session = model.session()
            # the plugin repacks the weights on the first call and computes with its own copies from then on: the
            # mapped file's pages it reads go back to the system as it goes (spare_memory.py), so that the file and
            # the repacked copies are never resident at once (the load's peak memory)
            with releasing_mapped(model.weights_file):
                session.feed([0] * WARM_UP_BLOCK, rows=1)
                session.feed([0], rows=1)
                if getattr(model, "prefill", None) is not None:  # the long-prompt prefill copy repacks its own
                    session.reset()
                    session.begin_long_prefill()
                    session.feed([0] * WARM_UP_BLOCK, rows=1)

    def _start_batching(self, max_wait: float) -> None:
        """Sessions of this engine share a block pool per paged model and a scheduler that verifies their blocks
        together (see batching.py) if the target gives the same bits batched as alone, checked once per machine."""
        target = self.target_model
        if target.rollback_method != "paged" or not target.block_invariant:
            self.batching_note = ("sessions verify one by one: batching needs a bit-exact paged target "
                                  f"(this one: {target.rollback_method}, exact: {target.block_invariant})")
            return
        if not self.measured("target/batch_invariant", batch_invariant, target):
            self.batching_note = ("sessions verify one by one: a batched call did not give the bits of a single "
                                  "one on this device")
            return
        self.pools = {role: BlockPool(model.compiled) for role, model in (("draft", self.draft_model),
                                                                           ("target", target))
                      if model is not None and model.rollback_method == "paged"}
        self.scheduler = Scheduler(max_wait, order=tuple(self.pools.values()))  # a round drafts, then verifies
        self.batching_note = "sessions verify together in batched target calls"

    @cached_property
    def draft_retokenizer(self) -> Retokenizer:
        """The draft's tokenizer, compiled when a heterogeneous algorithm first needs it."""
        draft_tokenizer = PromptTokenizer(self.bundle.draft.tokenizer_xml, self.core)
        return Retokenizer(draft_tokenizer.encode, self.vocab_map.draft)

    def resolve_algorithm(self, algorithm: str, config: Optional[GenerationConfig] = None) -> str:
        """The algorithm to run for this bundle (see algorithms.resolve): `auto` follows the vocabulary relation
        and the sampling mode."""
        vocabulary = self.bundle.vocabulary
        return resolve(algorithm, vocabulary["relation"], self.draft_model is not None,
                       greedy=config is None or config.greedy, draft_share=vocabulary.get("draft_share", 0))

    def algorithms(self) -> list[str]:
        """The algorithms this engine can run (besides auto), the target alone first."""
        return available(self.bundle.vocabulary["relation"], self.draft_model is not None)

    @cached_property
    def chat_template(self) -> Optional[ChatTemplate]:
        """The chat template conversations are rendered with: EngineConfig.chat_template's file if given, else the
        target's own."""
        given = self.config.chat_template
        return ChatTemplate.from_model_folder(self.bundle.target.folder, Path(given) if given is not None else None)

    @cached_property
    def grammar_tokenizer(self) -> GrammarTokenizer:
        """The target's vocabulary as structured output's grammar engine reads it (built at the first request
        with a constraint, then kept). Text is spelled as a continuation, as for the draft (see
        draft_grammar_tokenizer): a tokenizer's own encode may put a BOS or a dummy space in front."""
        retokenizer = self.target_retokenizer
        return GrammarTokenizer(self.vocab_map.target, self.target_model.vocab_size,
                                list(self.bundle.target.eos_token_ids or []),
                                lambda text: retokenizer.continuation([], text.encode()), self.special_token_texts)

    @cached_property
    def draft_grammar_tokenizer(self) -> GrammarTokenizer:
        """The draft's vocabulary as the grammar engine reads it, for a drafter that drafts in it under a
        constraint (built at the first such request, then kept). Its end of text is the draft's EOS when that
        stands for one of the target's: a draft may end the text only where the target's grammar lets it.
        Where the grammar forces bytes, llguidance's mask allows only the first token of the tokenizer's spelling
        of them, so text is spelled as a continuation (no BOS, no SentencePiece dummy space in front)."""
        draft_eos = self.bundle.draft.special_tokens.get("eos_token_id")
        target_eos = set(self.bundle.target.eos_token_ids or [])
        ends = draft_eos is not None and int(self.vocab_map.draft_to_target[draft_eos]) in target_eos
        retokenizer = self.draft_retokenizer
        return GrammarTokenizer(self.vocab_map.draft, self.draft_model.vocab_size, [draft_eos] if ends else [],
                                lambda text: retokenizer.continuation([], text.encode()))

    @cached_property
    def tool_format(self) -> Optional[ToolFormat]:
        """How the target's family writes tool calls, read from its chat template (None: it knows no tools)."""
        return tool_format(self.chat_template.source if self.chat_template else None)

    @cached_property
    def special_token_texts(self) -> dict[int, str]:
        """How a chat template spells the target's special tokens (read once per engine: tokenizer.json is
        megabytes for a large vocabulary)."""
        return special_token_texts(self.bundle.target.folder, self.bundle.target.special_tokens)

    @cached_property
    def draft_special_twins(self) -> dict[int, int]:
        """The target's special tokens that the draft's vocabulary has under the same name (ChatML's <|im_start|>
        and <|im_end|> in Qwen's and SmolLM2's): target id -> draft id, so that a draft of another vocabulary reads
        a chat's turns as its own (heterogeneous.draft_prompt_ids). Read once per engine, like
        special_token_texts; empty without a draft."""
        if self.bundle.draft is None:
            return {}
        target, draft = self.vocab_map.target, self.vocab_map.draft
        named = {text: i for i, text in special_token_texts(self.bundle.draft.folder,
                                                            self.bundle.draft.special_tokens).items()
                 if 0 <= i < len(draft) and not draft.has_text[i]}
        return {i: named[text] for i, text in self.special_token_texts.items()
                if text in named and 0 <= i < len(target) and not target.has_text[i]}

    def chat_prompt(self, messages: list[dict], tools: Optional[list[dict]] = None) -> list[int]:
        """Token ids for a conversation ([{"role": "user", "content": ...}, ...]), by the target's chat template;
        tools: the functions the model may call (OpenAI's `tools`), which the template describes to it."""
        if self.chat_template is None:
            raise EdgeSpecdecError("this bundle's target has no chat template (a base model?): use a plain "
                                   "prompt instead of chat.")
        ids = self.tokenizer.encode(self.chat_template.render(messages, tools))
        bos = self.bundle.target.special_tokens.get("bos_token_id")
        if bos is not None and ids[:2] == [bos, bos]:  # the template wrote BOS and the tokenizer added it again
            ids = ids[1:]
        return ids

    @cached_property
    def answer_opening(self) -> tuple[int, ...]:
        """The token ids of the chat template's answer opening (ChatTemplate.answer_opening), by which the target's
        sessions find a prompt's turns (session.py, "A chat's turns"); none without a template."""
        opening = self.chat_template.answer_opening if self.chat_template is not None else None
        return tuple(self.tokenizer.encode(opening, add_special=False)) if opening else ()

    def chat_head(self, prompt: Union[str, list[int]], prompt_ids: list[int]) -> Optional[ChatHead]:
        """The prompt's chat head, which a draft window keeps as its head where it fits (draft_window.py): what the
        chat template wrote before the last user message's own text, found by the text the template writes before
        a user message (ChatTemplate.user_opening). None without a template, or for a prompt that holds no such
        text. Its text is what a draft of another vocabulary reads of it: the prompt's own text up to there, or,
        for token ids, their text."""
        opening = self.chat_template.user_opening if self.chat_template is not None else None
        if opening is None:
            return None
        pieces, special = self.vocab_map.target, self.special_token_texts

        def spell(token: int) -> bytes:  # as the template writes it: a special token by its text
            piece = pieces.piece(token) if token < len(pieces) else None
            return piece if piece is not None else special.get(token, "").encode()
        tokens = chat_head_length(prompt_ids, spell, opening.encode())
        if not tokens:
            return None
        if isinstance(prompt, str) and opening in prompt:
            return ChatHead(tokens, prompt[:prompt.rindex(opening) + len(opening)])
        return ChatHead(tokens, decode(pieces, prompt_ids[:tokens]))

    def weight_prices(self, algorithm: str) -> tuple[float, float, float]:
        """Round prices for the cost policy that do not depend on the clock: the target's step is one unit, each
        more token in its block a tenth of one, and a drafted token the draft's share of the target's weight
        bytes (a step of a small model reads its weights once); prompt lookup drafts for free."""
        draft = self.bundle.draft if REGISTRY[algorithm].needs_draft else None
        share = weight_bytes(draft) / weight_bytes(self.bundle.target) if draft else 0.0
        return share, 1.0, 0.1

    def session(self) -> "DecodingSession":
        """A new decoding session on this engine: its own KV caches, the compiled models shared."""
        return DecodingSession(self)

    def start_chat(self, system: Optional[str] = None, on_overflow: str = "error") -> Conversation:
        """A conversation on a session of its own: messages rendered with the chat template, the KV caches kept
        from turn to turn (see conversation.py). on_overflow: "error" refuses a turn past the context, "shift"
        drops the oldest exchanges after the system prompt (see context_shift.py)."""
        return Conversation(self, self.session(), system, on_overflow)

    def forget(self, scope: Optional[str] = None) -> None:
        """Empty the draft pool (of one scope, or all of it with None): later requests copy nothing from earlier
        ones until they add to it again."""
        if self.draft_pool is not None:
            self.draft_pool.forget(scope)

    # "/draft-copies" when the draft runs on static copies of its call sizes (the Python API's and serve's engines),
    # "" when it does not (`run`'s, `chat`'s): see guard_name
    guard_scope = ""

    def guard_name(self, key: str) -> str:
        """The measurement a guard verdict for requests of this kind (`guard_key`) is kept under. Engines whose
        draft runs on static copies keep theirs apart from engines whose draft does not: the copies make the
        draft's calls cheaper, so drafting can win on one and lose on the other with the same pair and prompts."""
        return f"guard/{key}{self.guard_scope}"

    def default_guard_key(self, config: Optional[GenerationConfig] = None, prompt_tokens: int = 0) -> str:
        """The guard_key of the default algorithm's (`auto`'s) requests with this config (the engine's defaults
        filling what it leaves unset) after a prompt of prompt_tokens: the verdict a run of the default reads."""
        config = (config or self.default_config).with_defaults(self.default_config)
        return guard_key(REGISTRY[self.resolve_algorithm(AUTO, config)], config, prompt_tokens)

    def guard_prior(self, key: str) -> Optional[dict]:
        """What the drafting guard of the last run of this kind learned on this machine (see DraftingGuard)."""
        return self.measurements.known(self.guard_name(key))

    def remember_guard(self, key: str, learned: Optional[dict]) -> None:
        """Keep a run's guard verdict for the next run of its kind, in this process and, with a cache, later ones
        (written to disk when its mode, re-check interval or count of runs lost changed, not for every request's new
        rates; a verdict for the target alone also when its countdown to the next check of drafting moved: a
        one-shot process starts from the countdown on disk, and one frozen there would keep runs shorter than it
        from ever drafting again)."""
        if learned is not None:
            before = self.guard_prior(key) or {}
            fields = ("mode", "interval", "lost") + (() if learned.get("mode") else ("left",))
            changed = any(before.get(field) != learned.get(field) for field in fields)
            self.measurements.put(self.guard_name(key), learned, write=changed)

    def measured(self, name: str, measure: Callable, *args):
        """A measurement of this engine's models, taken once on this machine (see measurements.py)."""
        return self.measurements.get(name, partial(measure, *args))

    def block_shapes(self, k: int, drafting: bool) -> dict[str, int]:
        """How each model runs its short blocks in a call with draft length k (0: the target alone): the fewest
        tokens a call feeds (`ModelSession.min_block`) per role. Short blocks are widened to k + 1 (target) or
        DRAFT_BLOCK (draft) where that pays (`fixed_block_pays`), and the target's single steps to the cheaper of
        2 and 3 tokens (`cheapest_step`); each measured once per machine on a scratch session (fixed_blocks=False:
        neither). An idle draft is not measured."""
        key = (k, drafting)
        if key in self._block_shapes:
            return self._block_shapes[key]
        shapes = {}
        for role, size, used in (("target", k + 1, True), ("draft", DRAFT_BLOCK, drafting)):
            model = getattr(self, f"{role}_model")
            if model is None:
                continue
            shapes[role] = 1
            if not used or model.rollback_method != "paged" or self.config.fixed_blocks is False:
                continue
            if k > 0 and (self.config.fixed_blocks or self.measured(f"{role}/fixed_block/{size}",
                                                             lambda: fixed_block_pays(model.session(), size))):
                shapes[role] = size
            elif role == "target":
                shapes[role] = self.measured(f"{role}/step", lambda: cheapest_step(model.session()))
        self._block_shapes[key] = shapes
        return shapes

    def _static_sizes(self) -> dict[str, set[int]]:
        """The block sizes each model that takes static shapes gets copies for: its single steps, and the fixed
        blocks of the bundle's default draft length (k + 1 tokens for the target, DRAFT_BLOCK for the draft).
        Other draft lengths run on the dynamic model: what a request can make the engine compile is fixed here."""
        if not any(self._static.values()):
            return {}
        k = REGISTRY[self.resolve_algorithm("auto")].draft_tokens  # the default algorithm's draft length
        return self._copy_sizes(k, self.draft_model is not None)

    def _copy_sizes(self, k: int, drafting: bool) -> dict[str, set[int]]:
        """The block sizes a request with draft length k (0: the target alone) calls most, per model that takes
        static shapes: each model's single step (a run with a draft may run the target alone for a while, see
        DraftingGuard) and, with k, its fixed block."""
        sizes: dict[str, set[int]] = {"target": set(), "draft": set()}
        for kk, drafts in ((0, False), (k, drafting)) if k else ((0, False),):
            for role, least in self.block_shapes(kk, drafts).items():
                model = getattr(self, f"{role}_model")
                if not self._static[role] or model.rollback_method != "paged" or (role == "draft" and not drafts):
                    continue
                step = max(1 if role == "draft" else least, 2 if model.block_invariant else 1)
                sizes[role] |= {step, kk + 1 if role == "target" else DRAFT_BLOCK} if kk else {step}
        return {role: found for role, found in sizes.items() if found}

    def _plan_static_copies(self, sizes: dict[str, set[int]]) -> None:
        """Plan the static copies (see _static_sizes) instead of compiling them during the load: a paged model's
        compile is paid in every process (OpenVINO cannot import its blob from the cache), and it is most of what
        a load would cost. The first request that calls a planned size compiles its copy (`compile_static_for`),
        in the request's own thread, before its run starts; the copy runs once and, on the target, passes the check
        for its bits (CompiledLM.add_static) before it serves. No thread compiles on its own, so no compile
        outlives the engine's requests; `compile_static_copies` compiles them all at once."""
        for role, found in sizes.items():
            model = getattr(self, f"{role}_model")
            model.plan_static(found, invariant=self._static_copies_exact if role == "target" else None)

    def compile_static_for(self, k: int, drafting: bool) -> None:
        """Compile the planned static copies that a request with draft length k (0: the target alone) calls and
        that no request compiled yet, now, before its run: a compile inside the run would count in the times
        its drafting guard compares (a round of seconds), and in its Stats."""
        if any(model is not None and model.planned for model in (self.target_model, self.draft_model)):
            for role, found in self._copy_sizes(k, drafting).items():
                getattr(self, f"{role}_model").compile_planned(found)

    def _static_copies_exact(self, session: ModelSession) -> bool:
        """Whether the target gives its dynamic model's bits with the static copies of a scratch session, measured
        once per machine (outside the measurement cache's lock, which requests take)."""
        name = f"target/static_invariant/{','.join(map(str, sorted(session.static_sizes)))}"
        known = self.measurements.known(name)
        if known is None:
            known = is_block_invariant(session)
            self.measurements.put(name, known)
        return known is True

    def compile_static_copies(self) -> None:
        """Compile now, in the calling thread, the static copies that no call has needed yet (the target's first,
        its single step before its block), so that the calls after this one never wait for a compile: for timing
        a server that has run for a while."""
        for model in (self.target_model, self.draft_model):
            if model is not None:
                model.compile_planned()


def bundle_defaults(bundle: Bundle) -> GenerationConfig:
    """The GenerationConfig of the defaults the bundle's manifest records (`generation_defaults`, written by export
    with --generation-default); a field it does not record keeps GenerationConfig's own. A value that is no
    GenerationConfig field or that the config refuses is a BundleError naming it."""
    defaults = bundle.generation_defaults
    where = f"{bundle.path / MANIFEST_FILE}: generation_defaults"
    try:
        return GenerationConfig(**defaults).validate().pinned()
    except TypeError:
        known = {f.name for f in dataclasses.fields(GenerationConfig)}
        unknown = sorted(set(defaults) - known)
        raise BundleError(f"{where} names {', '.join(map(repr, unknown)) or 'a field'} that is no GenerationConfig "
                          f"field ({', '.join(sorted(known))}); remove it or re-export the bundle.") from None
    except EdgeSpecdecError as exc:
        raise BundleError(f"{where}: {exc} Fix it or re-export the bundle.") from None


def long_prompt(prompt_tokens: int) -> bool:
    """Is a prompt this long a long one (at least SEQUENCES_AFTER tokens), after which a target step and a
    verification block cost other times (a longer past, and another call layout)?"""
    return prompt_tokens >= SEQUENCES_AFTER


def guard_key(entry: Algorithm, config: GenerationConfig, prompt_tokens: int = 0) -> str:
    """The kind of request whose drafting guard verdicts carry over: what moves acceptance the most (the
    algorithm, a repetition penalty, sampling, a grammar), not the prompt; and whether the prompt is long
    (`long_prompt`), after which the target's calls cost other times, so a verdict from short prompts does not hold
    there, nor one from long ones on short prompts. A long prompt's verdict is kept per band of lengths from a power
    of two to the next (1024-2047 tokens, 2048-4095, ...): a verification block reads the past once per token there,
    so its cost over a step's grows with the past, and drafting that wins after 2048 tokens can lose after 4096."""
    kind = (f"{entry.name}/penalty={config.repetition_penalty:g}/{'greedy' if config.greedy else 'sampled'}"
            f"/{'grammar' if config.constraint is not None else 'free'}")
    return f"{kind}/long-prompt-{1 << (prompt_tokens.bit_length() - 1)}" if long_prompt(prompt_tokens) else kind


class DecodingSession:
    """One request's decoding state on an Engine: the target's (and draft's) KV caches and infer requests.

    A session decodes one generate() call at a time; sessions of one engine decode in parallel threads.
    draft_steer: how a sampling draft model draws its tokens (Drafter.steer): set only by `edge-specdec pair`'s
    simulation, which drafts along stored answers of the target (pairing/sampled.py); None in every real run."""

    draft_steer: Optional[Callable[[list[int], list[int], np.ndarray], int]] = None

    def __init__(self, engine: Engine):
        self.engine = engine
        self.target: ModelSession = engine.target_model.session(engine.pools.get("target"))
        self.draft: Optional[ModelSession] = (engine.draft_model.session(engine.pools.get("draft"))
                                              if engine.draft_model else None)
        self.target.answer_opening = engine.answer_opening
        for role, session in (("target", self.target), ("draft", self.draft)):
            if role in engine.pools:  # a batching engine: calls go through its scheduler
                session.scheduler = engine.scheduler

    def generate(self, prompt: Union[str, list[int]], config: Optional[GenerationConfig] = None,
                 speculative: Optional[SpeculativeConfig] = None, *,
                 on_text: Optional[Callable[[str], Optional[bool]]] = None,
                 cancel: Optional[threading.Event] = None, record_target_calls: bool = False,
                 on_prefill: Optional[Callable[[PrefillProgress], Any]] = None, **settings) -> Result:
        """Generate a continuation of prompt (text, or token ids in the target's vocabulary).

        config: what to generate, the sampling and stopping; a field it leaves unset takes the bundle's default
        (the engine's default_config, as the manifest records it; see GenerationConfig). speculative:
        how to draft (default SpeculativeConfig(): auto, with the algorithm's defaults). Either's fields may be
        given as keyword arguments, `generate(prompt, max_new_tokens=64, algorithm="slem")`, as in OpenVINO
        GenAI; beside a config they override its fields. on_text receives the text as it
        becomes final; returning True from it stops generation, and so does setting `cancel` (checked every round
        and between the calls of a long prompt's prefill, from any thread). on_prefill hears where the prompt's
        prefill stands (a PrefillProgress, at its start, between its calls and at its end: a progress bar for a
        long prompt). A seeded sampled run reproduces with every setting: the cost policy then prices its
        rounds from the models' weight sizes instead of the clock (see `weight_prices`). The output is the
        target's whatever `speculative` says. record_target_calls: keep each target pass's size, past length and
        seconds in result.stats.target_calls (a measurement, see generate.TargetCall; off by default).
        """
        engine = self.engine
        config, speculative = generate_configs(config, speculative, settings)
        config = engine.default_config if config is None else config.with_defaults(engine.default_config)
        if config.eos_token_ids is None:  # a copy: the caller's config may serve other bundles too
            config = dataclasses.replace(config, eos_token_ids=engine.bundle.target.eos_token_ids)
        prompt_ids = engine.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not prompt_ids:
            raise EdgeSpecdecError("the prompt is empty: give some text to continue.")
        check_token_ids(prompt_ids, self.target.vocab_size)
        check_logit_bias(config.logit_bias, self.target.vocab_size)
        grammar = (engine.grammar_tokenizer.compile(config.constraint, base=len(prompt_ids))
                   if config.constraint is not None else None)
        entry = REGISTRY[engine.resolve_algorithm(speculative.algorithm, config)]
        k, confidence = speculative.draft_tokens(entry), speculative.confidence_stop()
        self._set_block_shapes(k if entry.speculates else 0, entry.needs_draft)
        engine.compile_static_for(k if entry.speculates else 0, entry.needs_draft)  # the first such request only
        rng = np.random.default_rng(config.seed)
        # a seeded sampled run must repeat: it reads no pool (earlier requests) and no clock (see sources.py)
        seeded = config.seed is not None and not config.greedy
        clocked = speculative.clock and not seeded
        window = speculative.window_tokens(draft_room(self.draft)) if self.draft else None
        # the chat head matters where the window may cut the text: a prompt and output of more than half the window
        # in the target's tokens (a draft of another vocabulary may spell the text in more tokens)
        cut = window is not None and 2 * (len(prompt_ids) + config.max_new_tokens) > window
        context = self._draft_context(prompt, prompt_ids, config, rng, confidence,
                                      None if seeded else speculative.pool_scope, window,
                                      engine.chat_head(prompt, prompt_ids) if cut else None)
        drafter = entry.drafter and entry.drafter(context)
        if entry.needs_draft and speculative.lookup:
            drafter = FreeFirst(drafter, context.free_drafter(), clock=clocked)
        length = self._draft_length(entry, speculative, k, config, len(prompt_ids))
        # a seeded sampled run drafts one round at a time: drafting ahead draws from the run's random numbers in
        # another order, so its text would depend on the placement
        concurrent = engine.concurrent and drafter is not None and entry.drafts_ahead and not seeded
        with engine.scheduler.generating() if engine.scheduler else nullcontext():
            result = generate(self.target, prompt_ids, config, TextStream(engine.vocab_map.target), drafter, length,
                              rng, on_text, concurrent=concurrent, cancel=cancel,
                              reuse_prefix=engine.config.prefix_reuse,
                              alone_block=engine.block_shapes(0, False)["target"], grammar=grammar,
                              record_target_calls=record_target_calls, on_prefill=on_prefill)
        if length.guard is not None:
            engine.remember_guard(guard_key(entry, config, len(prompt_ids)), length.guard.learned())
        if engine.draft_pool is not None and speculative.pool_scope is not None:
            engine.draft_pool.add(prompt_ids + result.token_ids, speculative.pool_scope)
        result.extra.update(algorithm=entry.name, **(drafter.stats() if drafter else {}))
        if engine.config.prefix_reuse and not self.target.block_invariant:
            result.extra["prefix_reuse"] = "off: the target is not block-invariant here, so the prompt was fed whole"
        return result

    def _draft_context(self, prompt: Union[str, list[int]], prompt_ids: list[int], config: GenerationConfig,
                       rng: np.random.Generator, confidence: float, pool_scope: Optional[str],
                       draft_window: Optional[int] = None, chat_head: Optional[ChatHead] = None) -> DraftContext:
        """What this request's drafter is built from (see algorithms.DraftContext); pool_scope None: it reads no
        draft pool; draft_window: the most tokens the draft model reads (None: all of a sequence); chat_head: the
        prompt's, the window's head where it fits."""
        engine = self.engine
        draft_eos = engine.bundle.draft.info["special_tokens"].get("eos_token_id") if engine.bundle.draft else None
        pool = engine.draft_pool if pool_scope is not None else None
        return DraftContext(self.draft, self.target.vocab_size, engine.vocab_map, engine.target_retokenizer,
                            lambda: engine.draft_retokenizer, draft_eos, prompt, prompt_ids, config, rng, confidence,
                            draft_grammar_tokenizer=lambda: engine.draft_grammar_tokenizer, pool=pool,
                            pool_scope=pool_scope or "", draft_window=draft_window, steer=self.draft_steer,
                            chat_head=chat_head, draft_special_twins=lambda: engine.draft_special_twins)

    def _draft_length(self, entry: Algorithm, speculative: SpeculativeConfig, k: int,
                      config: GenerationConfig, prompt_tokens: int) -> DraftLength:
        """How many tokens each round drafts: k, by the policy, under the batching cap and the drafting guard
        (guard None: on for `auto`, unless the run is seeded sampling or reads no clock)."""
        seeded = config.seed is not None and not config.greedy
        clocked = speculative.clock and not seeded  # False: no decision here reads the clock
        guard, policy = speculative.guard, speculative.draft_policy
        if guard is None:  # the default algorithm never runs slower than the target alone (see DraftingGuard)
            guard = speculative.algorithm == AUTO and clocked and entry.needs_draft
        elif guard and seeded:
            raise EdgeSpecdecError("guard=True would make a seeded sampled run depend on the clock, so that it "
                                   "would not reproduce: leave it off for seeded runs.")
        prices = self.engine.weight_prices(entry.name) if not clocked and policy == "cost" else None
        prior = self.engine.guard_prior(guard_key(entry, config, prompt_tokens)) if guard else None
        # after a long prompt a check of drafting starts with the draft's prefill of its window: no early checks
        quick = not long_prompt(prompt_tokens)
        return DraftLength(k, policy, prices=prices, cap=None if seeded else self._draft_cap,
                           guard=DraftingGuard(prior=prior, quick_recheck=quick) if guard else None)

    def _draft_cap(self) -> Optional[int]:
        """The most tokens this round may draft: no cap (None), unless the engine batches and more than
        draft_max_sessions sessions generate now; then crowded_draft_tokens."""
        scheduler, config = self.engine.scheduler, self.engine.config
        if scheduler is None or config.draft_max_sessions is None:
            return None
        return None if scheduler.active <= config.draft_max_sessions else config.crowded_draft_tokens

    def stream(self, prompt: Union[str, list[int]], config: Optional[GenerationConfig] = None,
               **options) -> "TextIterator":
        """Iterate over the text as it is generated (see Pipeline.stream)."""
        return TextIterator(self, prompt, config, options)

    def _set_block_shapes(self, k: int, drafting: bool) -> None:
        """Each model's fewest tokens a call feeds, for a call with draft length k (see Engine.block_shapes)."""
        for role, least in self.engine.block_shapes(k, drafting).items():
            getattr(self, role).min_block = least


class Pipeline(Engine):
    """An Engine with one decoding session of its own: `generate` and `stream` run on it one call at a time (a
    lock serializes callers). `session()` gives a thread a session of its own on the same loaded models.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._own = self.session()
        self._lock = threading.Lock()

    @property
    def target(self) -> ModelSession:
        """The Pipeline's own session on the target."""
        return self._own.target

    @property
    def draft(self) -> Optional[ModelSession]:
        return self._own.draft

    def generate(self, prompt: Union[str, list[int], Sequence[Union[str, list[int]]]],
                 config: Optional[GenerationConfig] = None, speculative: Optional[SpeculativeConfig] = None,
                 **options) -> Union[Result, list[Result]]:
        """Generate a continuation of prompt on the Pipeline's own session; arguments as for
        DecodingSession.generate. Several prompts (a list of texts, or of lists of token ids) give a list of
        Results, one per prompt in order, each the Result that prompt gets alone (see _generate_many)."""
        if is_several_prompts(prompt):
            return self._generate_many(list(prompt), config, speculative, options)
        with self._lock:
            return self._own.generate(prompt, config, speculative, **options)

    def _generate_many(self, prompts: list, config: Optional[GenerationConfig],
                       speculative: Optional[SpeculativeConfig], options: dict) -> list[Result]:
        """Each prompt on a session of its own, up to SESSIONS_AT_ONCE at once, each session in a thread of its own:
        on an engine with batching (EngineConfig.batching) their target calls join in batched calls. The first
        failure is raised once every prompt has run."""
        for callback, what in (("on_text", "streams the text"), ("on_prefill", "reports the prefill")):
            if options.get(callback) is not None:
                raise EdgeSpecdecError(f"{callback} {what} of one prompt: give one prompt per call for it, or leave "
                                       f"{callback} out to generate several at once.")
        pending: "queue.Queue" = queue.Queue()
        for item in enumerate(prompts):
            pending.put(item)
        results: list[Optional[Result]] = [None] * len(prompts)

        def work(session: DecodingSession) -> None:  # one session takes prompts until none is left
            while True:
                try:
                    i, prompt = pending.get_nowait()
                except queue.Empty:
                    return
                results[i] = session.generate(prompt, config, speculative, **options)

        # the sessions exist before any thread starts, so that the threads start generating together
        sessions = [self.session() for _ in range(min(len(prompts), SESSIONS_AT_ONCE))]
        with ThreadPoolExecutor(len(sessions), thread_name_prefix="prompts") as pool:
            workers = [pool.submit(work, session) for session in sessions]
        for worker in workers:
            worker.result()
        return results

    async def agenerate(self, prompt: Union[str, list[int], Sequence[Union[str, list[int]]]],
                        config: Optional[GenerationConfig] = None, speculative: Optional[SpeculativeConfig] = None,
                        **options) -> Union[Result, list[Result]]:
        """generate() for asyncio: it runs in a worker thread, so the event loop stays free while it generates.
        Cancelling the awaiting task stops the generation within a round (its `cancel` event is set)."""
        cancel = options.pop("cancel", None) or threading.Event()
        try:
            return await asyncio.to_thread(self.generate, prompt, config, speculative, cancel=cancel, **options)
        except asyncio.CancelledError:
            cancel.set()
            raise

    def stream(self, prompt: Union[str, list[int]], config: Optional[GenerationConfig] = None,
               **options) -> "TextIterator":
        """Iterate over the text as it is generated; the Result is in .result once the iterator is exhausted.

        Leaving the loop early (break) stops generation: the loop's iterator is closed when it is dropped, or call
        .close(). Options as for generate(). `async for piece in pipe.stream(...)` iterates for asyncio, the event
        loop free while each piece is awaited.
        """
        return TextIterator(self, prompt, config, options)



def check_token_ids(ids: list[int], vocab_size: int) -> None:
    """Prompt token ids must index the target's vocabulary: an id past it would read outside the embedding
    table."""
    bad = next((i for i, t in enumerate(ids) if not isinstance(t, (int, np.integer)) or not 0 <= t < vocab_size),
               None)
    if bad is not None:
        raise EdgeSpecdecError(f"prompt token id {ids[bad]!r} at position {bad} is not a token of the target: ids "
                               f"run from 0 to {vocab_size - 1}.")


def is_several_prompts(prompt: Any) -> bool:
    """Whether generate() was given several prompts: a list of texts or of token id lists (a list of ints is one
    prompt of token ids)."""
    return (isinstance(prompt, (list, tuple)) and len(prompt) > 0
            and all(isinstance(p, (str, list, tuple)) for p in prompt))


def check_logit_bias(bias: dict[int, float], vocab_size: int) -> None:
    """logit_bias's keys must be token ids of the target."""
    bad = next((t for t in bias if isinstance(t, (int, np.integer)) and t >= vocab_size), None)
    if bad is not None:
        raise EdgeSpecdecError(f"logit_bias names token id {bad}, which is not a token of the target: ids run from "
                               f"0 to {vocab_size - 1}.")


def draft_room(draft: ModelSession) -> Optional[int]:
    """The most tokens a draft's window may hold (None: no bound known): its context, and no more than a prompt
    it takes in one prefill (a draft on the NPU is compiled for prompts of npu_max_prompt tokens), so that a window
    read into an empty cache always fits."""
    bounds = [b for b in (draft.max_context, draft.longest_prompt) if b is not None]
    return min(bounds) if bounds else None


def weight_bytes(model) -> int:
    """The size of a bundle model's weights file."""
    return model.model_xml.with_suffix(".bin").stat().st_size


def draft_output_ids(tokens: TokenBytes, draft_vocab: int) -> Optional[np.ndarray]:
    """The draft's token ids to keep in its output layer: the first draft_vocab, and every token without text
    (special tokens such as EOS, which often sit at the end of the vocabulary). None: keep them all."""
    if not draft_vocab or draft_vocab >= len(tokens):
        return None
    return np.flatnonzero((np.arange(len(tokens)) < draft_vocab) | ~tokens.has_text)


class TextIterator:
    """Runs one generate() call in a background thread and hands its text pieces over as an iterator (`for`), or
    as an asynchronous one (`async for`).

    The thread holds only the queue and the cancel event, not the iterator: an iterator that is dropped
    (abandoned before its end, or never iterated) cancels its generation within a round."""

    def __init__(self, pipe: Union[Pipeline, DecodingSession], prompt, config, options):
        self._cancel = threading.Event()
        # settings generate() would refuse are refused here, where stream() is called, not at the first piece
        generate_configs(config, options.get("speculative"),
                         {name: value for name, value in options.items() if name not in GENERATE_CALL_OPTIONS})
        self._pieces: "queue.Queue" = queue.Queue()
        self._outcome: dict = {}  # "result" or "error", set by the thread
        self._thread = threading.Thread(target=_stream_worker, daemon=True,
                                        args=(pipe, prompt, config, options, self._pieces, self._cancel,
                                              self._outcome))
        self._thread.start()

    @property
    def result(self) -> Optional[Result]:
        return self._outcome.get("result")

    def __iter__(self) -> Iterator[str]:
        try:
            while not self._cancel.is_set() and (piece := self._pieces.get()) is not None:
                yield piece
        finally:
            self.close()
        if "error" in self._outcome:
            raise self._outcome["error"]

    async def __aiter__(self) -> AsyncIterator[str]:
        """`async for`: the same pieces, each awaited in a worker thread so that the event loop stays free; leaving
        the loop early stops generation, as for the plain iterator."""
        try:
            while not self._cancel.is_set() and (piece := await asyncio.to_thread(self._pieces.get)) is not None:
                yield piece
        finally:
            self._cancel.set()
            await asyncio.to_thread(self._thread.join)
        if "error" in self._outcome:
            raise self._outcome["error"]

    def close(self) -> None:
        """Stop generating (if still running) and wait for the background thread; .result then holds the text."""
        self._cancel.set()
        self._thread.join()

    def __del__(self) -> None:
        self._cancel.set()


def _stream_worker(pipe: Pipeline, prompt, config, options, pieces: "queue.Queue", cancel: threading.Event,
                   outcome: dict) -> None:
    try:
        outcome["result"] = pipe.generate(prompt, config, on_text=pieces.put, cancel=cancel, **options)
    except BaseException as exc:  # handed to the consumer's thread
        outcome["error"] = exc
    finally:
        pieces.put(None)
