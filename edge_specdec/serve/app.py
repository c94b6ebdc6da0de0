"""The ASGI app behind `edge-specdec serve`: OpenAI's completions and chat endpoints on one engine's sessions.

One Engine holds the weights; `slots` DecodingSessions on it decode in parallel worker threads, one request
each; further requests wait in a bounded queue (429 when it is full). A request's text pieces cross from its
worker thread to the event loop through a queue; a client that disconnects sets the request's cancel event, which
generate() checks every round, and its slot goes back to the pool as soon as the worker returns.
"""
from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import json
import logging
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Optional

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..demo import DEMO_BUNDLE
from ..errors import EdgeSpecdecError
from ..runtime.generate import PrefillProgress, Result
from ..runtime.pipeline import DecodingSession, Engine, check_logit_bias
from ..runtime.sampling import GenerationConfig
from ..runtime.context_shift import SHIFT_FILL, overflow_message, shift, shift_record
from ..runtime.session import ContextOverflowError
from ..runtime.settings import EngineConfig
from ..runtime.text import decode, unfinished_end
from ..runtime.tool_calls import ToolFormat
from .guard import HostPolicy, RequestGuard
from .metrics import Metrics
from .protocol import (ParsedRequest, RequestError, Responder, decode_json, error_body, parse_detokenize,
                       parse_request, parse_tokenize)
from .prefix_store import Prepared, PrefixStore
from .slots import SlotPool

log = logging.getLogger("edge_specdec.serve")
STATIC = Path(__file__).resolve().parent / "static"


@dataclass
class ServerSettings:
    """What `edge-specdec serve` is started with (see its --help). bundle None: the packaged demo."""
    bundle: Optional[str] = None
    slots: int = 2
    queue: int = 16
    api_key: Optional[str] = None
    cors: list[str] = field(default_factory=list)
    host: str = "127.0.0.1"  # the address the server is bound to: a Host header it always answers to
    allowed_hosts: list[str] = field(default_factory=list)  # more host names it answers to (see guard.py)
    max_body_bytes: int = 1 << 20
    max_tokens: int = 1024  # the most tokens one request may generate, and a chat request's default
    model_name: Optional[str] = None  # default: the bundle folder's name
    engine: EngineConfig = field(default_factory=EngineConfig)  # how the engine loads and runs (but batching)
    warm_up: bool = True  # one short generation before /health says ok
    batching: Optional[bool] = None  # verify the slots' blocks together (Engine(batching=)); None: when slots > 1
    prefix_cache_mb: float = 0  # the prefix store's bound in MiB (see prefix_store.py); 0: no store
    idle_timeout: float = 15.0  # seconds a connection may take to send a request head (see connections.py)
    body_timeout: float = 30.0  # seconds a request's body may take to arrive after its head (Server.read_json)
    context_shift: bool = False  # a chat past the context loses its oldest exchanges instead of a 400 (fit_prompt)

    def check(self) -> "ServerSettings":
        if self.slots < 1:
            raise EdgeSpecdecError(f"--slots must be at least 1, not {self.slots}.")
        if self.queue < 0:
            raise EdgeSpecdecError(f"--queue must be 0 (no waiting) or more, not {self.queue}.")
        if self.max_tokens < 1:
            raise EdgeSpecdecError(f"--max-tokens must be at least 1, not {self.max_tokens}.")
        if not 0 <= self.prefix_cache_mb < float("inf"):
            raise EdgeSpecdecError(f"--prefix-cache-mb must be 0 (no store) or more MiB, not {self.prefix_cache_mb}.")
        for name in ("idle_timeout", "body_timeout"):
            value = getattr(self, name)
            if not 0 < value < float("inf"):
                raise EdgeSpecdecError(f"--{name.replace('_', '-')} must be a number of seconds above 0, not {value}.")
        return self


class Server:
    """The state behind the app: the engine (loaded in a background thread), the slots and the metrics."""

    def __init__(self, settings: ServerSettings, engine: Optional[Engine] = None):
        self.settings = settings.check()
        self.bundle = settings.bundle or str(DEMO_BUNDLE)
        self.model_name = settings.model_name or Path(self.bundle).name
        self.engine: Optional[Engine] = None
        self.slots: Optional[SlotPool[DecodingSession]] = None
        self.store: Optional[PrefixStore] = None  # the prefix store, once loaded (with --prefix-cache-mb)
        self.load_error: Optional[str] = None
        self.on_load_error: Optional[Callable[[str], None]] = None  # the CLI stops the server
        self.executor = ThreadPoolExecutor(settings.slots, thread_name_prefix="decode")
        self.metrics = Metrics({
            "queue_depth": ("requests waiting for a slot", lambda: self.slots.depth if self.slots else 0),
            "slots_busy": ("slots generating", lambda: self.slots.busy if self.slots else 0),
            "slots_total": ("decoding slots (sessions on the one engine)", lambda: self.settings.slots),
            "sequences_per_batched_call": ("the mean number of sessions' blocks in a batched call",
                                           lambda: self.batching_stats()["mean_sequences_per_batched_call"]),
            "prefix_store_bytes": ("bytes of KV caches held in the prefix store (host memory)",
                                   lambda: self.store.nbytes if self.store is not None else 0),
            "prefix_store_entries": ("conversations' caches held in the prefix store",
                                     lambda: len(self.store) if self.store is not None else 0),
            "prefix_store_limit_bytes": ("the prefix store's bound (--prefix-cache-mb; 0: no store)",
                                         lambda: self.store.max_bytes if self.store is not None else 0),
            "draft_pool_tokens": ("tokens of earlier requests held in the draft pool, for free drafts",
                                  lambda: self.draft_pool()["tokens"]),
            "draft_pool_limit_tokens": ("the draft pool's bound (--draft-pool-tokens; 0: no pool)",
                                        lambda: self.draft_pool()["max_tokens"]),
        }, read_counters={
            "batched_calls": ("model calls that ran several sessions' blocks together",
                              lambda: self.batching_stats()["batched_calls"]),
        })
        self._given_engine = engine

    # --- loading ------------------------------------------------------------------------------------------------

    def load(self) -> None:
        """Open the engine and its sessions, then warm up one of them; /health answers 503 until this is done."""
        try:
            batching = self.settings.slots > 1 if self.settings.batching is None else self.settings.batching
            engine = self._given_engine or Engine(
                self.bundle, config=dataclasses.replace(self.settings.engine, batching=batching))
            sessions = [engine.session() for _ in range(self.settings.slots)]
            if self.settings.warm_up:  # measures and compiles what the first requests would otherwise wait for
                sessions[0].generate(engine.tokenizer.encode("Hello") or [0], GenerationConfig(max_new_tokens=4),
                                     pool_scope=None)
            self.store = self.prefix_store(engine)
            self.engine, self.slots = engine, SlotPool(sessions, self.settings.queue)
            log.info("edge-specdec serve: %s loaded (%s); %d slots%s%s", self.model_name,
                     engine.placement.describe(), self.settings.slots,
                     f"; {engine.batching_note}" if engine.batching_note else "",
                     f"; {engine.long_prompt_note}" if engine.long_prompt_note else "")
        except Exception as exc:  # reported by /health and the CLI; the server does not serve a half-loaded engine
            self.load_error = f"{type(exc).__name__}: {exc}" if not isinstance(exc, EdgeSpecdecError) else str(exc)
            log.error("edge-specdec serve: loading %s failed: %s", self.bundle, self.load_error)
            if self.on_load_error:
                self.on_load_error(self.load_error)

    def prefix_store(self, engine: Engine) -> Optional[PrefixStore]:
        """The store of --prefix-cache-mb: only where slots reuse prefixes at all (prefix reuse on, a
        block-invariant target) and the target's cache can be copied (see prefix_store.py)."""
        if not self.settings.prefix_cache_mb or not engine.config.prefix_reuse:
            return None
        target = engine.target_model
        if target.rollback_method != "paged" or not target.block_invariant:
            log.warning("edge-specdec serve: no prefix store: the target's cache (%s, exact: %s) is not reused or "
                        "cannot be copied", target.rollback_method, target.block_invariant)
            return None
        return PrefixStore(int(self.settings.prefix_cache_mb * 2**20))

    def batching_stats(self) -> dict:
        scheduler = self.engine.scheduler if self.engine is not None else None
        return scheduler.stats() if scheduler else {"batched_calls": 0, "mean_sequences_per_batched_call": 0.0}

    def ready(self) -> Engine:
        if self.engine is None:
            raise RequestError(self.load_error or "the model is still loading: retry in a few seconds.", status=503,
                               code="model_loading" if not self.load_error else "model_failed",
                               kind="server_error", headers={"Retry-After": "2"} if not self.load_error else None)
        return self.engine

    def draft_pool(self) -> dict:
        """The draft pool's bound and contents (suffix.DraftPool.describe); zeros before the load or without one."""
        pool = self.engine.draft_pool if self.engine else None
        return pool.describe() if pool else {"max_tokens": 0, "tokens": 0, "documents": 0, "scopes": 0}

    # --- requests -----------------------------------------------------------------------------------------------

    def pool_scope(self, request: Request) -> str:
        """The part of the draft pool a request reads and adds to: one per API key (a digest of the key the
        request authorized with), so that no key's requests see another's text; "" on a server without a key."""
        if not self.settings.api_key:
            return ""
        given = request.headers.get("authorization", "").strip().partition(" ")[2].strip()
        return hashlib.sha256(given.encode("latin-1")).hexdigest()[:16]

    def authorize(self, request: Request) -> None:
        """The API key, when the server has one: 'Authorization: Bearer KEY' (the scheme in any case, as HTTP's
        auth schemes are), compared in constant time so that the answer's timing tells nothing of the key."""
        key = self.settings.api_key
        if not key:
            return
        scheme, _, given = request.headers.get("authorization", "").strip().partition(" ")
        # header values arrive decoded as latin-1: encoded back, they are the bytes the client sent
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode("latin-1"),
                                                                 key.encode("utf-8")):
            raise RequestError("missing or wrong API key: send the header 'Authorization: Bearer <key>' with the "
                               "key the server was started with (--api-key).", status=401, code="invalid_api_key")

    async def read_json(self, request: Request) -> Any:
        """The request's body as JSON: only an application/json body (a browser sends another type cross-site
        without asking first), within --max-body-bytes, and JSON as decode_json checks it."""
        media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media_type != "application/json":
            raise RequestError(f"the request body must be JSON, sent with 'Content-Type: application/json' (not "
                               f"{media_type or 'no content type'!r}).", status=415,
                               code="unsupported_media_type")
        limit, seconds = self.settings.max_body_bytes, self.settings.body_timeout
        if int(request.headers.get("content-length") or 0) > limit:
            raise RequestError(f"the request body is over the server's limit of {limit} bytes.", status=413)
        try:
            body = await asyncio.wait_for(read_body(request, limit), seconds)
        except asyncio.TimeoutError:  # a body that stalls mid-upload holds a connection and a buffer
            self.metrics.count("connections_timed_out_total", phase="body")
            raise RequestError(f"the request body did not arrive within {seconds:g} s of its head (--body-timeout): "
                               f"send it whole.", status=408, code="request_timeout",
                               headers={"Connection": "close"}) from None
        return decode_json(body)

    async def prompt_ids(self, engine: Engine, parsed: ParsedRequest) -> list[int]:
        loop = asyncio.get_running_loop()
        if parsed.kind == "chat":
            try:
                ids = await loop.run_in_executor(None, engine.chat_prompt, parsed.messages, parsed.tools)
            except EdgeSpecdecError as exc:
                raise RequestError(f"{exc} (this server's /v1/completions takes plain prompts).") from None
        elif isinstance(parsed.prompt, str):
            ids = await loop.run_in_executor(None, engine.tokenizer.encode, parsed.prompt)
        else:
            ids = parsed.prompt
            vocabulary = len(engine.vocab_map.target)
            if any(not 0 <= t < vocabulary for t in ids):
                raise RequestError(f"prompt token ids must be between 0 and {vocabulary - 1}.", param="prompt")
        if not ids:
            raise RequestError("the prompt is empty once tokenized: give some text.", param="prompt")
        return ids

    async def fit_prompt(self, engine: Engine, parsed: ParsedRequest, prompt_ids: list[int]) -> tuple[list[int], int]:
        """The prompt to generate from and how many messages went: with --context-shift, a chat whose prompt
        leaves less room than it wants (max_tokens, else a quarter of the context up to --max-tokens) loses its
        oldest exchanges after the system prompt (see context_shift.py); any other prompt as it is. A request
        without max_tokens is refused only where a server without the shift refuses it too (no room for one
        token); otherwise its answer gets the room left (fit_context)."""
        context = engine.target_model.max_context
        if not self.settings.context_shift or parsed.kind != "chat" or context is None:
            return prompt_ids, 0
        wanted = min(parsed.max_tokens or context - int(context * SHIFT_FILL), self.settings.max_tokens)
        needed = parsed.max_tokens or 1
        if len(prompt_ids) + wanted <= context:
            return prompt_ids, 0

        def tokenize(messages: list[dict]) -> list[int]:
            return engine.chat_prompt(messages, parsed.tools)

        try:
            parsed.messages, prompt_ids, dropped = await asyncio.get_running_loop().run_in_executor(
                None, shift, parsed.messages, tokenize, context, wanted, needed)
        except ContextOverflowError as exc:
            raise RequestError(str(exc), param="messages", code="context_length_exceeded") from None
        return prompt_ids, dropped

    def check_max_tokens(self, parsed: ParsedRequest) -> None:
        """A request that asks for more tokens than --max-tokens is refused, before its prompt is fitted."""
        asked, cap = parsed.max_tokens, self.settings.max_tokens
        if asked is not None and asked > cap:
            raise RequestError(f"max_tokens {asked} is over this server's limit of {cap} (--max-tokens).",
                               param="max_tokens")

    def fit_context(self, engine: Engine, parsed: ParsedRequest, prompt_tokens: int) -> None:
        """Set the request's token budget: what it asked for (at most --max-tokens: check_max_tokens), or (chat) the
        room left, up to --max-tokens."""
        cap, context = self.settings.max_tokens, engine.target_model.max_context
        room = cap if context is None else min(cap, context - prompt_tokens)
        asked = parsed.max_tokens
        if room < (asked or 1):
            chat = parsed.kind == "chat"
            fix = ("Shorten the messages or lower max_tokens; a server started with --context-shift drops the "
                   "oldest messages instead." if chat else "Shorten the prompt or lower max_tokens.")
            raise RequestError(overflow_message(context, prompt_tokens, asked or 1, fix),
                               param="messages" if chat else "prompt", code="context_length_exceeded")
        parsed.config.max_new_tokens = asked or room

    async def complete(self, request: Request, kind: str) -> Response:
        arrival = time.perf_counter()
        self.authorize(request)
        engine = self.ready()
        parsed = parse_request(await self.read_json(request), kind, engine.default_config.repetition_penalty)
        parsed.speculative = dataclasses.replace(parsed.speculative, pool_scope=self.pool_scope(request))
        tool_format = self.tool_format(engine, parsed)
        ids = await self.prompt_ids(engine, parsed)
        self.check_max_tokens(parsed)
        prompt_ids, dropped = await self.fit_prompt(engine, parsed, ids)
        self.fit_context(engine, parsed, len(prompt_ids))
        self.check_settings(engine, parsed)
        session = await acquire_slot(request, self.slots,
                                     affinity=lambda slot: slot.target.shared_prefix(prompt_ids))
        if session is None:
            self.metrics.count("requests_total", endpoint=kind, outcome="cancelled")
            return Response(status_code=499)
        job = Job(self, session, prompt_ids, parsed, time.perf_counter() - arrival, dropped)
        responder = Responder(parsed, self.model_name, self.token_bytes)
        if parsed.stream:
            return StreamingResponse(self.events(request, job, responder, tool_format), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        watcher = asyncio.create_task(cancel_on_disconnect(request, job.cancel))
        try:
            result = await job.future
        except asyncio.CancelledError:  # this request's task was cancelled (Ray Serve does so when its client
            job.cancel.set()            # leaves or it times out): stop its generation too
            raise
        finally:
            watcher.cancel()
        if tool_format is not None:
            responder.content, responder.tool_calls = tool_format.parse(result.text)
        return JSONResponse(responder.response(result, len(prompt_ids)))

    @staticmethod
    def check_settings(engine: Engine, parsed: ParsedRequest) -> None:
        """Refuse, before a stream starts rather than in the worker, settings the engine cannot run: a value out of
        bounds, an algorithm this bundle cannot run, a logit bias for a token the target does not have."""
        try:
            parsed.config.validate()
            # the request keeps "auto" if it asked for it, so that the default's drafting guard stays on (a pinned
            # name would switch it off)
            engine.resolve_algorithm(parsed.speculative.algorithm, parsed.config)
        except EdgeSpecdecError as exc:
            raise RequestError(str(exc), param="edge_specdec" if "algorithm" in str(exc) else None) from None
        try:
            check_logit_bias(parsed.config.logit_bias, len(engine.vocab_map.target))
        except EdgeSpecdecError as exc:
            raise RequestError(str(exc), param="logit_bias") from None

    @staticmethod
    def tool_format(engine: Engine, parsed: ParsedRequest) -> Optional[ToolFormat]:
        """A request with tools: the target family's tool-call format, and the request's constraint set to the
        grammar that holds its calls to the tools' schemas; None without tools."""
        if not parsed.tools:
            return None
        tool_format = engine.tool_format
        if tool_format is None:
            raise RequestError("this model's chat template does not describe tool calls, so the server cannot "
                               "tell the model about tools: send the request without tools, or start the server "
                               "with --chat-template FILE, a template that does (edge-specdec info says whether "
                               "one does).", param="tools")
        parsed.config.constraint = tool_format.grammar(parsed.tools, parsed.tool_choice, parsed.parallel_tool_calls)
        return tool_format

    async def events(self, request: Request, job: "Job", responder: Responder,
                     tool_format: Optional[ToolFormat] = None) -> AsyncIterator[str]:
        """The server-sent events of a streamed completion: a chunk per run of text from one source, the last
        chunk with the finish reason and statistics, the usage chunk if asked for, then [DONE]. With tools, the
        text from the first call's opening tag on is held back and sent as tool_calls deltas at the end; the logprobs
        of held-back text go with the next chunk sent (the calls' chunk, for a call's tokens)."""
        watcher = asyncio.create_task(cancel_on_disconnect(request, job.cancel))
        handed = 0  # logprob entries of the pieces so far
        held = HeldText(tool_format.open if tool_format else None)
        unsent: list = []  # logprob entries of text held back
        try:
            first = responder.first_chunk()
            if first:
                yield sse(first)
            while (piece := await job.pieces.get()) is not None:
                if isinstance(piece, PrefillProgress):
                    yield sse(responder.progress_chunk(piece))
                    continue
                logprobs = list(piece.logprobs)
                for span in piece.spans:
                    text = held.pass_on(span.text)
                    unsent, logprobs = unsent + logprobs[:span.tokens], logprobs[span.tokens:]
                    if text or not held.active:
                        yield sse(responder.text_chunk(text, span.source, span.tokens, unsent))
                        unsent = []
                handed += len(piece.logprobs)
            try:
                result = await job.future
            except Exception as exc:
                yield sse(self.failure(job.request.kind, exc).body())
            else:
                if tool_format is not None:
                    responder.content, responder.tool_calls = tool_format.parse(result.text)
                    rest = held.rest() if not responder.tool_calls else ""
                    if rest:
                        yield sse(responder.text_chunk(rest, "target", 0, unsent))
                        unsent = []
                    if responder.tool_calls:
                        yield sse(responder.tool_calls_chunk(responder.tool_calls, unsent))
                        unsent = []
                yield sse(responder.last_chunk(result, unsent + (result.logprobs or [])[handed:]))
                if job.request.include_usage:
                    yield sse(responder.usage_chunk(result, len(job.prompt_ids)))
            yield "data: [DONE]\n\n"
        finally:
            watcher.cancel()
            job.cancel.set()  # a stream closed early (the client left) stops its generation

    def token_bytes(self, token: int) -> bytes:
        return self.engine.vocab_map.target.piece(token) or b""

    def record(self, job: "Job", result: Result) -> None:
        """Count a finished generation (a failed one is counted by `failure`)."""
        count = self.metrics.count
        stats = result.stats
        cancelled = result.stop_reason in ("stopped", "interrupted")
        count("requests_total", endpoint=job.request.kind, outcome="cancelled" if cancelled else "ok")
        count("prompt_tokens_total", len(job.prompt_ids))
        count("prompt_tokens_reused_total", stats.prompt_tokens_reused)
        count("prompt_tokens_prefilled_total", stats.prompt_tokens_prefilled)
        count("slot_prefix_hits_total", int(stats.prompt_tokens_reused > 0 and not job.prepared.restored))
        count("generation_tokens_total", stats.new_tokens)
        count("draft_tokens_proposed_total", stats.draft_tokens_proposed)
        count("draft_tokens_accepted_total", stats.draft_tokens_accepted)
        count("target_passes_total", stats.target_passes)
        if stats.new_tokens:
            self.metrics.observe("time_to_first_token_seconds", job.queued_seconds + stats.first_token_seconds)
        if stats.new_tokens > 1:
            self.metrics.observe("time_per_output_token_seconds",
                                 (stats.seconds - stats.first_token_seconds) / (stats.new_tokens - 1))

    def failure(self, endpoint: str, exc: BaseException) -> RequestError:
        """An error as the client sees it: a RequestError as it is, anything else a 500 that hides the trace."""
        if isinstance(exc, RequestError):
            self.metrics.count("requests_total", endpoint=endpoint,
                               outcome="rejected" if exc.status == 429 else "client_error")
            return exc
        if isinstance(exc, EdgeSpecdecError):  # a request the runtime refused (a context overflow, a bad value)
            self.metrics.count("requests_total", endpoint=endpoint, outcome="client_error")
            return RequestError(str(exc))
        log.error("edge-specdec serve: a request failed:\n%s", "".join(traceback.format_exception(exc)))
        self.metrics.count("requests_total", endpoint=endpoint, outcome="server_error")
        return RequestError(f"the server failed on this request ({type(exc).__name__}); it keeps serving. The "
                            f"server's log has the details.", status=500, kind="server_error")

    # --- the other endpoints ------------------------------------------------------------------------------------

    def model_card(self) -> dict:
        engine = self.engine
        card = {"id": self.model_name, "object": "model", "created": int(Path(self.bundle).stat().st_mtime),
                "owned_by": "edge-specdec"}
        if engine is not None:
            bundle = engine.bundle
            card["edge_specdec"] = {
                "target": source_name(bundle.manifest["target"]), "draft": source_name(bundle.manifest.get("draft")),
                "vocabulary_relation": bundle.vocabulary["relation"], "chat_template": engine.chat_template is not None,
                "max_context": engine.target_model.max_context, "placement": vars(engine.placement),
                "algorithms": ["auto", *engine.algorithms()],
                "slots": self.settings.slots, "batching": engine.scheduler is not None,
                "batching_note": engine.batching_note, "max_tokens": self.settings.max_tokens,
                "default_repetition_penalty": engine.default_config.repetition_penalty}
        return card

    async def list_models(self, request: Request) -> Response:
        self.authorize(request)
        self.ready()
        return JSONResponse({"object": "list", "data": [self.model_card()]})

    async def show_model(self, request: Request) -> Response:
        self.authorize(request)
        self.ready()
        if request.path_params["model"] != self.model_name:
            raise RequestError(f"the model {request.path_params['model']!r} does not exist here; this server serves "
                               f"{self.model_name!r}.", status=404, code="model_not_found")
        return JSONResponse(self.model_card())

    async def tokenize(self, request: Request) -> Response:
        """llama-server's /tokenize: {"content", "add_special"} -> {"tokens"}, in the target's vocabulary."""
        self.authorize(request)
        engine = self.ready()
        content, add_special = parse_tokenize(await self.read_json(request))
        tokens = await asyncio.get_running_loop().run_in_executor(None, engine.tokenizer.encode, content,
                                                                  add_special)
        return JSONResponse({"tokens": tokens})

    async def detokenize(self, request: Request) -> Response:
        """llama-server's /detokenize: {"tokens"} -> {"content"}, the text as a completion spells those tokens
        (special tokens have none)."""
        self.authorize(request)
        engine = self.ready()
        tokens = parse_detokenize(await self.read_json(request), len(engine.vocab_map.target))
        return JSONResponse({"content": decode(engine.vocab_map.target, tokens)})

    async def metrics_text(self, request: Request) -> Response:
        self.authorize(request)
        return PlainTextResponse(self.metrics.render(), media_type="text/plain; version=0.0.4")

    def health(self) -> Response:
        if self.engine is None:
            status = {"status": "error", "error": self.load_error} if self.load_error else {"status": "loading"}
            return JSONResponse(status, status_code=503)
        return JSONResponse({"status": "ok", "model": self.model_name, "slots": self.settings.slots,
                             "busy": self.slots.busy, "queued": self.slots.depth, "draft_pool": self.draft_pool()})


def source_name(model: Optional[dict]) -> Optional[str]:
    """A bundle model's source as the model card shows it: a hub id as it is, a local folder by its name only (the
    exporting machine's paths are not the clients' business)."""
    if not model:
        return None
    source = model.get("source", {})
    given = str(source.get("given") or "")
    return Path(given).name if source.get("kind") == "local" else given


class Job:
    """One request's generate() call on a slot's session, in a worker thread; its text pieces (TextPiece), and with
    return_progress its prefill's progress (PrefillProgress), come to the event loop through `pieces`, then None.
    When the call returns, the slot goes back to the pool and the run is counted in the metrics, whether or not a
    client is still there to read it. dropped_messages: how many messages the context shift took from the request
    (reported in the result's extra["context_shift"])."""

    def __init__(self, server: Server, session: DecodingSession, prompt_ids: list[int], request: ParsedRequest,
                 queued_seconds: float, dropped_messages: int = 0):
        loop = asyncio.get_running_loop()
        self.request, self.prompt_ids, self.queued_seconds = request, prompt_ids, queued_seconds
        self.cancel = threading.Event()
        self.pieces: asyncio.Queue = asyncio.Queue()
        self.prepared = Prepared()  # what the prefix store did for this request's slot

        def to_loop(piece) -> None:  # a TextPiece (on_text) or a PrefillProgress (on_prefill)
            loop.call_soon_threadsafe(self.pieces.put_nowait, piece)

        def run() -> Result:
            if server.store is not None:  # the slot's cache to the store, the prompt's from it (see prefix_store.py)
                self.prepared = server.store.prepare(session, prompt_ids)
                server.metrics.count("prefix_store_hits_total", int(self.prepared.restored))
                server.metrics.count("prefix_store_evictions_total", self.prepared.evicted)
            result = session.generate(prompt_ids, request.config, on_text=to_loop if request.stream else None,
                                      on_prefill=to_loop if request.return_progress else None,
                                      speculative=request.speculative, cancel=self.cancel)
            shifted = shift_record(dropped_messages, result.stats.prompt_tokens_prefilled)
            if shifted is not None:
                result.extra["context_shift"] = shifted
            return result

        work = server.executor.submit(run)
        # what the request awaits (cancelling it stops no thread); resolved only once the run is counted and its
        # slot is back, so that a client that has its answer finds both done
        self.future: asyncio.Future = loop.create_future()

        def finished(work) -> None:
            server.slots.release(session)
            self.pieces.put_nowait(None)
            if work.cancelled() or work.exception() is not None:
                if not self.future.done():
                    self.future.cancel() if work.cancelled() else self.future.set_exception(work.exception())
                return
            server.record(self, work.result())
            if not self.future.done():
                self.future.set_result(work.result())

        # on the worker's own future: the slot goes back once the worker has returned, even when the request's
        # task was cancelled while it ran (a cancelled asyncio future is done at once; its thread is not)
        work.add_done_callback(lambda work: loop.call_soon_threadsafe(finished, work))


async def cancel_on_disconnect(request: Request, cancel: threading.Event) -> None:
    """Set `cancel` when the client disconnects (the body is read by then: receive() waits for the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    cancel.set()


async def acquire_slot(request: Request, slots: SlotPool,
                       affinity: Optional[Callable[[DecodingSession], int]] = None) -> Optional[DecodingSession]:
    """A slot for this request (the free one its affinity prefers, see SlotPool), or None if its client
    disconnects while it waits. If this task is cancelled meanwhile (Ray Serve cancels the request of a client that
    left), a slot handed over just then goes back."""
    task = asyncio.ensure_future(slots.acquire(affinity))
    left = asyncio.create_task(cancel_on_disconnect(request, threading.Event()))
    try:
        await asyncio.wait({task, left}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        if task.done() and not task.cancelled() and task.exception() is None:
            slots.release(task.result())
        task.cancel()  # still waiting: SlotPool.acquire leaves the queue
        raise
    finally:
        left.cancel()
    if task.done():
        return task.result()
    task.cancel()  # the client left: SlotPool.acquire leaves the queue (or gives back a slot handed over just then)
    return None


class HeldText:
    """Streamed text with a tag held back: text goes on until the tag starts (an end of the text that could be its
    start, or whitespace, waits for the next piece: the content before a call is sent without the whitespace
    before it, as the whole answer's is); from the tag on, nothing goes on. Without a tag, everything goes on."""

    def __init__(self, tag: Optional[str]):
        self.tag, self.pending, self.found = tag, "", False

    @property
    def active(self) -> bool:
        return self.tag is not None

    def pass_on(self, text: str) -> str:
        if self.tag is None:
            return text
        self.pending += text
        if self.found:
            return ""
        at = self.pending.find(self.tag)
        self.found = at >= 0
        cut = at if self.found else len(self.pending) - unfinished_end(self.pending, [self.tag])
        cut = len(self.pending[:cut].rstrip())
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out

    def rest(self) -> str:
        """What was held back (the answer had no call after all)."""
        rest, self.pending = self.pending, ""
        return rest


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body, refused (413) as soon as it is over `limit` bytes."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise RequestError(f"the request body is over the server's limit of {limit} bytes.", status=413)
    return bytes(body)


def uvicorn_config(app: Starlette, **options):
    """uvicorn's Config for the app of create_app: connections that send no request head within --idle-timeout
    are closed (see connections.py), and uvicorn's keep-alive between requests is the same timeout."""
    import uvicorn

    from .connections import timed_protocol

    server = app.state.server
    seconds = server.settings.idle_timeout
    protocol = timed_protocol(seconds, lambda: server.metrics.count("connections_timed_out_total", phase="idle"))
    return uvicorn.Config(app, http=protocol, timeout_keep_alive=seconds, **options)


def sse(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


async def http_error(request: Request, exc: HTTPException) -> Response:
    """Starlette's own errors (an unknown path, a method a route does not take) as OpenAI error objects."""
    return JSONResponse(error_body(f"{request.method} {request.url.path}: {exc.detail}"), status_code=exc.status_code)


def create_app(settings: Optional[ServerSettings] = None, engine: Optional[Engine] = None) -> Starlette:
    """The ASGI app: the engine loads in a background thread when the app starts (its lifespan); `engine` serves
    one already loaded instead. `app.state.server` is the Server."""
    server = Server(settings or ServerSettings(), engine)

    def endpoint(handler: Callable, label: str):
        """A route's handler with its errors answered as OpenAI error objects and counted under `label`, the
        route's name (never its path: a path holds whatever a client puts in it)."""
        async def run(request: Request) -> Response:
            try:
                return await handler(request)
            except ClientDisconnect:  # the client left while sending its body: nobody to answer
                server.metrics.count("requests_total", endpoint=label, outcome="cancelled")
                return Response(status_code=499)
            except Exception as exc:
                error = server.failure(label, exc)
                return JSONResponse(error.body(), status_code=error.status, headers=error.headers)
        return run

    async def health(request: Request) -> Response:
        return server.health()

    async def page(request: Request) -> Response:
        return FileResponse(STATIC / "index.html")

    async def favicon(request: Request) -> Response:  # browsers ask for /favicon.ico whatever the page links
        return FileResponse(STATIC / "favicon.svg", media_type="image/svg+xml")

    @asynccontextmanager
    async def lifespan(app: Starlette):
        loader = threading.Thread(target=server.load, name="load-engine", daemon=True)
        loader.start()
        yield
        server.executor.shutdown(wait=True, cancel_futures=True)

    routes = [
        Route("/v1/chat/completions", endpoint(partial(server.complete, kind="chat"), "chat"), methods=["POST"]),
        Route("/v1/completions", endpoint(partial(server.complete, kind="completion"), "completion"),
              methods=["POST"]),
        Route("/v1/models", endpoint(server.list_models, "models"), methods=["GET"]),
        Route("/v1/models/{model:path}", endpoint(server.show_model, "model"), methods=["GET"]),
        Route("/tokenize", endpoint(server.tokenize, "tokenize"), methods=["POST"]),
        Route("/detokenize", endpoint(server.detokenize, "detokenize"), methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", endpoint(server.metrics_text, "metrics"), methods=["GET"]),
        Route("/", page, methods=["GET"]),
        Route("/favicon.ico", favicon, methods=["GET"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    settings = server.settings
    # the guard first: a request from a host name or an origin the server does not serve reaches nothing else
    middleware = [Middleware(RequestGuard, policy=HostPolicy(settings.host, settings.allowed_hosts, settings.cors))]
    if settings.cors:
        middleware.append(Middleware(CORSMiddleware, allow_origins=settings.cors, allow_methods=["GET", "POST"],
                                     allow_headers=["Authorization", "Content-Type"]))
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan,
                    exception_handlers={HTTPException: http_error})
    app.state.server = server
    return app
