"""The loop both benchmarks time their rows with: warm-ups, then every row back to back, the order rotated."""
from __future__ import annotations

import time
from typing import Callable, Sequence, TypeVar

Row = TypeVar("Row")  # what runs: a rows-benchmark Setup, a clients-benchmark Row
Cell = TypeVar("Cell")  # what it runs on: a prompt, a number of clients
Result = TypeVar("Result")  # what one run gives: a Run, a Round


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def run_interleaved(rows: Sequence[Row], cells: Sequence[Cell], repeats: int, say: Callable[[str], None], *,
                    name: Callable[[Row], str], label: Callable[[Cell], str],
                    run: Callable[[Row, Cell, int], Result], show: Callable[[Result], str],
                    keep: Callable[[Row, Cell, int, Result], None], fail: Callable[[Row, Cell, int, str], None],
                    warm_ups: Sequence[Cell]) -> bool:
    """One uncounted run of every row on each of warm_ups (repeat -1), then for each repeat and cell every row back
    to back, the order rotated by one from one (repeat, cell) to the next, so that every row goes first equally
    often and drift in machine speed (other jobs, thermal limits) hits all rows alike.

    run(row, cell, repeat) runs once and returns its result, which keep records; a run that raises is handed to
    fail with its error and the loop goes on. show(result) and label(cell) (ending in a space, or empty) make the
    progress lines, with an estimate of the time left. Returns False if interrupted (Ctrl-C): what ran so far is
    kept.
    """
    width = max(len(name(r)) for r in rows)
    try:
        for cell in warm_ups:
            for row in rows:
                head = f"  warm-up {label(cell)}{name(row):<{width}}"
                try:
                    say(f"{head} {show(run(row, cell, -1))}")
                except Exception as exc:  # noqa: BLE001 - the timed runs will record it
                    say(f"{head} FAILED: {type(exc).__name__}: {str(exc)[:160]}")
    except KeyboardInterrupt:
        return False
    total, done, start, rotation = repeats * len(cells) * len(rows), 0, time.perf_counter(), 0
    try:
        for rep in range(repeats):
            for cell in cells:
                shift = rotation % len(rows)
                rotation += 1
                for row in list(rows[shift:]) + list(rows[:shift]):
                    done += 1
                    elapsed = time.perf_counter() - start
                    head = (f"[{done:{len(str(total))}d}/{total}] rep {rep + 1}/{repeats} "
                            f"{label(cell)}{name(row):<{width}}")
                    try:
                        result = run(row, cell, rep)
                    except Exception as exc:  # noqa: BLE001 - a row that fails once must not end the run
                        error = f"{type(exc).__name__}: {str(exc)[:200]}"
                        fail(row, cell, rep, error)
                        say(f"{head} FAILED: {error}")
                        continue
                    keep(row, cell, rep, result)
                    eta = elapsed / (done - 1) * (total - done + 1) if done > 1 else None
                    say(f"{head} {show(result)}" + (f"  eta {format_duration(eta)}" if eta is not None else ""))
    except KeyboardInterrupt:
        say("interrupted: reporting what ran so far")
        return False
    say(f"timed runs took {format_duration(time.perf_counter() - start)}")
    return True
