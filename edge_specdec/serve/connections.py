"""Connections that hold the server without sending a request: uvicorn's HTTP protocol with a deadline for each
request head.

uvicorn's own keep-alive timer starts only after an answer and stops at the first byte that arrives, so a
connection that sends nothing after opening, or sends a request head a byte at a time, would stay open for good (a
few hundred such connections exhaust the process's file descriptors). Here a connection must send a whole request
head within `idle_timeout` seconds of opening, and of each answer it was sent; else it is closed and counted. A
request's body is timed by the app (Server.read_json), which answers 408.
"""
from __future__ import annotations

import asyncio
from typing import Callable, Optional

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


def timed_protocol(idle_timeout: float, on_timeout: Callable[[], None]) -> type:
    """uvicorn's h11 protocol whose connections get `idle_timeout` seconds for each request head; on_timeout() is
    called for every connection closed for want of one."""

    class TimedH11Protocol(H11Protocol):
        waiting: Optional[asyncio.TimerHandle] = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self.wait_for_head()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:  # a whole request head arrived
                self.stop_waiting()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                self.wait_for_head()

        def connection_lost(self, exc) -> None:
            self.stop_waiting()
            super().connection_lost(exc)

        def wait_for_head(self) -> None:
            self.stop_waiting()
            self.waiting = self.loop.call_later(idle_timeout, self.head_timed_out)

        def stop_waiting(self) -> None:
            if self.waiting is not None:
                self.waiting.cancel()
                self.waiting = None

        def head_timed_out(self) -> None:
            self.waiting = None
            if not self.transport.is_closing():
                on_timeout()
                self.transport.close()

    return TimedH11Protocol
