"""How each row of the clients benchmark serves N clients once: ours with a thread and a session per client on a
batching Engine, or one request after another on one session; GenAI's continuous batching with every request added
at once. Each returns a Round."""
from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

from ..errors import EdgeSpecdecError
from .client_setups import ClientPrompt, Request, Round
from .compare import forget_prompt


def _batched(engine) -> tuple[int, int]:
    """(batched calls, sessions' blocks in them) so far on a batching engine's scheduler; (0, 0) without one."""
    if engine.scheduler is None:
        return 0, 0
    stats = engine.scheduler.stats()
    return stats["batched_calls"], round(stats["batched_calls"] * stats["mean_sequences_per_batched_call"])


def _ours_request(prompt: ClientPrompt, start: float, stop: float, result, since: float) -> Request:
    """One of our requests, which ran from start to stop, its seconds and TTFT counted from `since`: the round's
    start (clients at once) or the request's own start (one after another)."""
    st = result.stats.as_dict()
    return Request(prompt.key, list(result.token_ids), result.text, stop - since,
                   ttft_ms=1000 * (start - since + st["first_token_seconds"]), tpot_ms=st["time_per_output_token_ms"],
                   proposed=st["draft_tokens_proposed"], accepted=st["draft_tokens_accepted"])


def ours_concurrent(sessions: list, algorithm: str, max_new_tokens: int) -> Callable[[list[ClientPrompt]], Round]:
    """N client threads, one session each, released together by a barrier."""
    from ..runtime import GenerationConfig

    config = GenerationConfig(max_new_tokens=max_new_tokens, temperature=0.0).pinned()
    engine = sessions[0].engine

    def run(prompts: list[ClientPrompt]) -> Round:
        n = len(prompts)
        barrier = threading.Barrier(n + 1)
        cancel = threading.Event()
        done: list[Any] = [None] * n

        def client(i: int) -> None:
            try:
                forget_prompt(sessions[i])  # each request prefills its whole prompt, as GenAI's (prefix cache off)
                barrier.wait()
                start = time.perf_counter()
                result = sessions[i].generate(prompts[i].ours, config, algorithm=algorithm, cancel=cancel,
                                              pool_scope=None)
                done[i] = (start, time.perf_counter(), result)
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread
                done[i] = exc

        threads = [threading.Thread(target=client, args=(i,), name=f"client-{i}", daemon=True) for i in range(n)]
        for t in threads:
            t.start()
        calls_before, sequences_before = _batched(engine)
        barrier.wait()
        t0 = time.perf_counter()
        try:
            for t in threads:
                while t.is_alive():  # a join with a timeout, so that Ctrl-C reaches this thread
                    t.join(0.1)
        except KeyboardInterrupt:
            cancel.set()
            for t in threads:
                t.join()
            raise
        end = max((d[1] for d in done if isinstance(d, tuple)), default=t0)
        for d in done:
            if isinstance(d, BaseException):
                raise d
        requests = [_ours_request(prompt, start, stop, result, since=t0)
                    for prompt, (start, stop, result) in zip(prompts, done)]
        calls, sequences = _batched(engine)
        return Round("", n, 0, end - t0, requests, calls - calls_before, sequences - sequences_before)
    return run


def ours_sequential(session, algorithm: str, max_new_tokens: int) -> Callable[[list[ClientPrompt]], Round]:
    """The N requests one after another on one session."""
    from ..runtime import GenerationConfig

    config = GenerationConfig(max_new_tokens=max_new_tokens, temperature=0.0).pinned()

    def run(prompts: list[ClientPrompt]) -> Round:
        done = []  # the bookkeeping waits for the end, so that the requests' times add up to the wall time
        for prompt in prompts:
            forget_prompt(session)  # each request prefills its whole prompt, as GenAI's (prefix cache off)
            start = time.perf_counter()
            result = session.generate(prompt.ours, config, algorithm=algorithm, pool_scope=None)
            done.append((start, time.perf_counter(), result))
            if result.stop_reason == "interrupted":  # the session swallowed a Ctrl-C: hand it on
                raise KeyboardInterrupt
        wall = sum(stop - start for start, stop, _ in done)  # (emptying the caches between requests not counted)
        requests = [_ours_request(prompt, start, stop, result, since=start)
                    for prompt, (start, stop, result) in zip(prompts, done)]
        return Round("", len(prompts), 0, wall, requests)
    return run


def load_genai_cb(target_folder: Path, draft_folder: Optional[Path], need_alone: bool) -> tuple[Any, Any, str]:
    """GenAI's continuous-batching pipelines on the target (need_alone) and with the draft (draft_folder), its
    prefix cache off and its default CPU properties. Raises what GenAI raises."""
    import openvino_genai

    def scheduler():
        s = openvino_genai.SchedulerConfig()
        s.enable_prefix_caching = False  # every request pays its own prefill, as ours does
        return s
    alone = (openvino_genai.ContinuousBatchingPipeline(str(target_folder), scheduler(), "CPU")
             if need_alone else None)
    sd = None
    if draft_folder is not None:
        draft = openvino_genai.draft_model(str(draft_folder), "CPU")
        sd = openvino_genai.ContinuousBatchingPipeline(str(target_folder), scheduler(), "CPU", {"draft_model": draft})
    return alone, sd, openvino_genai.__version__


_request_ids = itertools.count()  # GenAI wants a request id per request, unique within a pipeline


def genai_cb(pipe, eos_token_ids: list[int], max_new_tokens: int, assistant_tokens: Optional[int] = None,
             confidence: Optional[float] = None) -> Callable[[list[ClientPrompt]], Round]:
    """N requests added to a ContinuousBatchingPipeline at once, then step() until all have finished; every
    handle is read after every step."""
    import numpy as np
    import openvino as ov
    import openvino_genai

    config = openvino_genai.GenerationConfig()
    config.max_new_tokens = max_new_tokens
    config.do_sample = False
    if eos_token_ids:  # the bundle's EOS tokens, as ours stops on (a fresh config knows none)
        config.set_eos_token_id(eos_token_ids[0])
        config.stop_token_ids = set(eos_token_ids)
    if assistant_tokens:
        config.num_assistant_tokens = assistant_tokens
    elif confidence:
        config.assistant_confidence_threshold = confidence
    running = openvino_genai.GenerationStatus.RUNNING
    finished = openvino_genai.GenerationStatus.FINISHED
    tokenizer = pipe.get_tokenizer()

    def run(prompts: list[ClientPrompt]) -> Round:
        inputs = [ov.Tensor(np.array([p.ids], dtype=np.int64)) for p in prompts]
        n = len(prompts)
        tokens: list[list[int]] = [[] for _ in range(n)]
        first: list[Optional[float]] = [None] * n
        end: list[Optional[float]] = [None] * n
        t0 = time.perf_counter()
        handles = [pipe.add_request(next(_request_ids), ids, config) for ids in inputs]

        def read(now: float) -> None:
            for i, h in enumerate(handles):
                if end[i] is not None:
                    continue
                if h.can_read():
                    for output in h.read().values():  # greedy: one sequence, its new tokens since the last read
                        tokens[i] += list(output.generated_ids)
                if tokens[i] and first[i] is None:
                    first[i] = now
                if h.get_status() != running and not h.can_read():
                    end[i] = now
        try:
            while pipe.has_non_finished_requests():
                pipe.step()
                read(time.perf_counter())
        except KeyboardInterrupt:
            for h in handles:  # leave the pipeline empty for whatever runs next
                h.cancel()
            while pipe.has_non_finished_requests():
                pipe.step()
            raise
        read(time.perf_counter())
        stop = max((e for e in end if e is not None), default=time.perf_counter())
        requests = []
        for i, (prompt, h) in enumerate(zip(prompts, handles)):
            status = h.get_status()
            if status != finished:
                raise EdgeSpecdecError(f"GenAI ended request {prompt.key} with status {status.name}"
                                       + (" (out of KV cache memory)" if status.name == "IGNORED" else ""))
            e = end[i] if end[i] is not None else stop
            n_tok = len(tokens[i])
            ttft = 1000 * (first[i] - t0) if first[i] is not None else None
            tpot = 1000 * (e - first[i]) / (n_tok - 1) if first[i] is not None and n_tok > 1 else None
            req = Request(prompt.key, tokens[i], tokenizer.decode(tokens[i]), e - t0, ttft_ms=ttft, tpot_ms=tpot)
            try:  # GenAI's own per-request clocks, beside ours
                pm = h.get_perf_metrics()
                req.engine_ttft_ms, req.engine_tpot_ms = pm.get_ttft().mean, pm.get_tpot().mean
            except Exception:  # noqa: BLE001 - not every GenAI version has them per handle
                pass
            requests.append(req)
        return Round("", n, 0, stop - t0, requests)
    return run

