"""The asyncio API: `await pipe.agenerate(...)` and `async for` over a stream, the event loop free meanwhile."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from edge_specdec.runtime import GenerationConfig, Pipeline
from support import SAME_VOCAB

PROMPT = "def fib(n):\n    if n < 2:\n        return n\n"
CONFIG = GenerationConfig(max_new_tokens=48, ignore_eos=True)


@pytest.fixture(scope="module")
def pipe(bundle_dir):
    return Pipeline(bundle_dir(*SAME_VOCAB))


async def ticking(work):
    """Await work() while a task ticks on the loop every millisecond: (its outcome, ticks that fell inside it)."""
    ticks: list[float] = []
    done = asyncio.Event()

    async def tick():
        while not done.is_set():
            ticks.append(time.perf_counter())
            await asyncio.sleep(0.001)

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0)  # the ticker has started
    start = time.perf_counter()
    outcome = await work()
    end = time.perf_counter()
    done.set()
    await ticker
    return outcome, sum(start < t < end for t in ticks)


def test_agenerate_leaves_the_loop_running_and_writes_generates_text(pipe):
    expected = pipe.generate(PROMPT, CONFIG, algorithm="standard")
    result, ticks = asyncio.run(ticking(lambda: pipe.agenerate(PROMPT, CONFIG, algorithm="standard")))
    assert result.token_ids == expected.token_ids and result.text == expected.text
    assert ticks >= 2, "the event loop stood still while generating"


def test_async_for_over_a_stream_leaves_the_loop_running(pipe):
    expected = pipe.generate(PROMPT, CONFIG, algorithm="standard")

    async def collect():
        stream = pipe.stream(PROMPT, CONFIG, algorithm="standard")
        return [piece async for piece in stream], stream.result

    (pieces, result), ticks = asyncio.run(ticking(collect))
    assert "".join(pieces) == expected.text and result.token_ids == expected.token_ids
    assert len(pieces) > 1 and ticks >= 2


def test_leaving_an_async_stream_stops_its_generation(pipe):
    async def first_piece():
        stream = pipe.stream(PROMPT, GenerationConfig(max_new_tokens=400, ignore_eos=True))
        pieces = stream.__aiter__()
        await pieces.__anext__()
        await pieces.aclose()  # what leaving `async for` early does, once the loop collects the iterator
        return stream.result

    result = asyncio.run(first_piece())
    assert result.stop_reason == "stopped" and len(result.token_ids) < 400


def test_cancelling_agenerate_stops_the_generation(pipe):
    cancel, started, cancelled_by_test = threading.Event(), threading.Event(), threading.Event()
    pieces: list[str] = []

    def on_text(piece):  # holds the generation after its first text until the task is cancelled
        pieces.append(piece)
        started.set()
        cancelled_by_test.wait(30)

    async def cancelled():
        task = asyncio.create_task(pipe.agenerate(PROMPT, GenerationConfig(max_new_tokens=400, ignore_eos=True),
                                                  cancel=cancel, on_text=on_text))
        assert await asyncio.to_thread(started.wait, 30), "the generation wrote no text"
        task.cancel()
        try:
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            cancelled_by_test.set()

    asyncio.run(cancelled())
    assert cancel.is_set()
    start = time.perf_counter()
    assert pipe.generate(PROMPT, GenerationConfig(max_new_tokens=4)).token_ids  # the pipeline is free again
    assert time.perf_counter() - start < 30
    assert len("".join(pieces)) < 400, "the generation ran on after its task was cancelled"
