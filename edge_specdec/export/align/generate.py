"""The training text: the target's own greedy continuations of the training prompts, from the bundle's target.

Several sessions of one batching Engine generate at once (their single-token steps run as one target call, which on
a CPU costs little more than one call alone), each taking the next prompt when it finishes one. Every finished
prompt is appended to WORK/data.jsonl at once, so a stop loses only the prompts in flight, and a resume skips the
prompts already there. Each record counts its draft tokens too (prompt and continuation in the draft's tokenizer),
the unit of the training cost, and the target's token ids; with `top` > 0 also the target's `top` most likely
tokens and their log-probabilities at each position (for training on the target's distribution, train.py;
computing them costs a log-softmax over the target's vocabulary per token, so only when asked). The caller's
keep_going(totals) is asked after every prompt: once it says no (the budget's time for generation is used), the
prompts in flight are stopped and kept as far as they got, which is still the target's own text.
"""
from __future__ import annotations

import queue
import threading
import time
from pathlib import Path
from typing import Any, Callable

from ...runtime import Engine, GenerationConfig
from .prompts import TrainPrompt, render
from .work import WorkFolder, add_to_totals, data_totals

PROGRESS_SECONDS = 15.0  # a progress line at most this often
TARGET_TOP = 8  # the target's most likely tokens kept per position of the training text


def generate_data(bundle: Path, prompts: list[TrainPrompt], work: WorkFolder, max_new_tokens: int, streams: int,
                  keep_going: Callable[[int], bool], say: Callable[[str], None], top: int = 0) -> dict[str, Any]:
    """Generate the continuations of the prompts not yet in data.jsonl; return the data's totals."""
    records, damaged = work.scan_data()
    done = {r["id"] for r in records}
    todo = [p for p in prompts if p.id not in done]
    totals = data_totals(records)
    tokens = totals["target_tokens"]
    if records:
        say(f"generate: {len(records)} prompts ({tokens:,} target tokens) already in {work.data_file.name}, "
            f"{len(todo)} to go" + (f"; {damaged} damaged lines skipped (their prompts are among those to go)"
                                    if damaged else ""))
    if not todo or not keep_going(totals):
        return totals
    engine = Engine(bundle, batching=streams > 1)
    config = GenerationConfig(max_new_tokens=max_new_tokens, temperature=0.0, top_logprobs=top)
    pending: "queue.Queue[TrainPrompt]" = queue.Queue()
    for p in todo:
        pending.put(p)
    out = work.appender()
    lock = threading.Lock()
    stop = threading.Event()          # the budget ended generation: keep what the prompts in flight have
    interrupted = threading.Event()   # Ctrl-C: drop the prompts in flight (a resume generates them again)
    errors: list[BaseException] = []
    count = {"prompts": 0, "tokens": tokens}
    draft_encode = engine.draft_retokenizer.encode
    start = last_line = time.monotonic()

    def worker() -> None:
        nonlocal last_line
        session = engine.session()
        while not stop.is_set() and not interrupted.is_set():
            try:
                prompt = pending.get_nowait()
            except queue.Empty:
                return
            try:
                draft_text, target_input = render(engine, prompt.text)
                result = session.generate(target_input, config, algorithm="none", cancel=stop)
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread
                errors.append(exc)
                stop.set()
                return
            if interrupted.is_set() or not result.token_ids:
                return
            record = {"id": prompt.id, "category": prompt.category, "split": prompt.split, "prompt": draft_text,
                      "completion": result.text, "target_tokens": len(result.token_ids),
                      "draft_tokens": len(draft_encode(draft_text)) + len(draft_encode(result.text)),
                      "stop_reason": result.stop_reason, "target_ids": result.token_ids}
            if top:
                record["target_top"] = [[[t for t, _ in lp.top], [round(v, 4) for _, v in lp.top]]
                                        for lp in result.logprobs]
            with lock:
                out.add(record)
                add_to_totals(totals, record)
                count["prompts"] += 1
                count["tokens"] += len(result.token_ids)
                now = time.monotonic()
                if now - last_line >= PROGRESS_SECONDS:
                    last_line = now
                    rate = (count["tokens"] - tokens) / (now - start)
                    say(f"generate: {len(done) + count['prompts']}/{len(prompts)} prompts, "
                        f"{count['tokens']:,} target tokens, {rate:.1f} tokens/s")
                if not keep_going(totals):
                    stop.set()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, streams))]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(timeout=0.5)
    except KeyboardInterrupt:
        interrupted.set()
        stop.set()
        for t in threads:
            t.join()
        raise
    finally:
        out.close()
    if errors:
        raise errors[0]
    elapsed = time.monotonic() - start
    say(f"generate: {count['prompts']} prompts, {count['tokens'] - tokens:,} target tokens in {elapsed:.0f} s "
        f"({(count['tokens'] - tokens) / max(elapsed, 1e-9):.1f} tokens/s, {streams} streams)"
        + ("; stopped by the budget" if stop.is_set() and not pending.empty() else ""))
    return {**data_totals(work.read_data()), "seconds_this_run": elapsed}

