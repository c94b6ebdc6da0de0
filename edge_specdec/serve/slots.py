"""Decoding slots: N sessions on one engine, and a bounded queue of requests waiting for one.

Every method runs on the event loop's thread (asyncio is single-threaded), so no lock is needed; a generation
that ends in a worker thread hands its session back through the loop (see app.py)."""
from __future__ import annotations

import asyncio
from collections import deque
from typing import Callable, Generic, Optional, TypeVar

from .protocol import RequestError

Slot = TypeVar("Slot")
RETRY_AFTER_SECONDS = 1


class QueueFull(RequestError):
    def __init__(self, slots: int, queue: int):
        super().__init__(f"the server is busy: {slots} requests are generating and {queue} are waiting (its limit). "
                         f"Retry after {RETRY_AFTER_SECONDS} s, or start the server with more --slots or --queue.",
                         status=429, code="queue_full", kind="rate_limit_error",
                         headers={"Retry-After": str(RETRY_AFTER_SECONDS)})


class SlotPool(Generic[Slot]):
    """Hands out slots first come, first served; at most `queue` requests wait, the next one gets QueueFull.

    Among free slots a request gets the one whose cache shares the most with its prompt (`affinity`, llama-server's
    slot similarity), else the one free the longest, whose cache is the least likely to be wanted again."""

    def __init__(self, slots: list[Slot], queue: int):
        self.size, self.queue_limit = len(slots), queue
        self.free: list[Slot] = list(slots)
        self.waiting: deque[asyncio.Future] = deque()

    @property
    def busy(self) -> int:
        return self.size - len(self.free)

    @property
    def depth(self) -> int:
        return len(self.waiting)

    async def acquire(self, affinity: Optional[Callable[[Slot], int]] = None) -> Slot:
        """A slot: at once if one is free (the best by affinity(slot), e.g. the prompt tokens its cache holds),
        else the next one released, in the order the requests came."""
        if self.free and not self.waiting:
            best = max(range(len(self.free)), key=lambda i: (affinity(self.free[i]) if affinity else 0, -i))
            return self.free.pop(best)
        if len(self.waiting) >= self.queue_limit:
            raise QueueFull(self.size, self.queue_limit)
        ticket = asyncio.get_running_loop().create_future()
        self.waiting.append(ticket)
        try:
            return await ticket
        except asyncio.CancelledError:  # the client left while waiting
            if ticket in self.waiting:
                self.waiting.remove(ticket)
            elif ticket.done() and not ticket.cancelled():  # a slot was handed over just as it left
                self.release(ticket.result())
            raise

    def release(self, slot: Slot) -> None:
        while self.waiting:
            ticket = self.waiting.popleft()
            if not ticket.done():
                ticket.set_result(slot)
                return
        self.free.append(slot)
