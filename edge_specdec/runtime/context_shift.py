"""A conversation longer than the context: the refusal that says by how much, and the opt-in shift that drops the
oldest exchanges.

An exchange is a user message with everything that follows it up to the next user message: the assistant's answer,
or its tool calls with their results, so a tool result never stays without its call. The messages before the first
exchange (the system prompt) and the last exchange (the question being answered) always stay. The shift drops
exchanges from the oldest on until the prompt fills at most SHIFT_FILL of the context (and leaves room for the
tokens asked for), or no more can go; when the system prompt and the last exchange alone do not fit, it refuses.

The kept messages are rendered afresh, so the new prompt shares with the cache only the tokens before the first
dropped message (the system prompt): the session's prefix reuse keeps that KV, which is exact, and prefills the rest
at its new positions. The turn is then what a fresh session writes on the kept messages.
"""
from __future__ import annotations

from typing import Callable, Optional

from .session import ContextOverflowError

OVERFLOW_POLICIES = ("error", "shift")  # refuse a turn past the context, or drop the oldest exchanges
SHIFT_FILL = 0.75  # the share of the context a shifted prompt fills at most, when it can


def exchanges(messages: list[dict]) -> tuple[int, list[tuple[int, int]]]:
    """(the number of leading system messages, the [start, end) spans of the exchanges after them). Messages
    before the first user message that are not system messages (a greeting) form an exchange of their own."""
    head = 0
    while head < len(messages) and messages[head].get("role") == "system":
        head += 1
    starts = [i for i in range(head, len(messages)) if i == head or messages[i].get("role") == "user"]
    return head, list(zip(starts, starts[1:] + [len(messages)]))


def overflow_message(context: int, prompt_tokens: int, wanted: int, fix: str) -> str:
    """The refusal of a prompt past the context: by how many tokens, and what to do."""
    over = prompt_tokens + wanted - context
    return (f"this model's context is {context} tokens; the prompt has {prompt_tokens} and {wanted} more were asked "
            f"for: {over} tokens over. {fix}")


def shift(messages: list[dict], tokenize: Callable[[list[dict]], list[int]], context: int,
          wanted: int) -> tuple[list[dict], list[int], int]:
    """The messages without their oldest exchanges, down to a prompt of at most SHIFT_FILL of the context with room
    for `wanted` more tokens: (the kept messages, their prompt's token ids, how many messages went). Raises
    ContextOverflowError when the system prompt and the last exchange alone leave no room for `wanted` tokens."""
    head, spans = exchanges(messages)
    fill = int(context * SHIFT_FILL)
    kept, ids = messages, tokenize(messages)
    for start, _ in spans[1:]:
        if len(ids) <= fill and len(ids) + wanted <= context:
            break
        kept = messages[:head] + messages[start:]
        ids = tokenize(kept)
    if len(ids) + wanted > context:
        raise ContextOverflowError(overflow_message(
            context, len(ids), wanted, "The system prompt and the last message alone do not fit, even with the "
            "older messages dropped: shorten them or ask for fewer tokens."))
    return kept, ids, len(messages) - len(kept)


def shift_record(dropped: int, prompt_tokens: int, reused: int) -> Optional[dict]:
    """What a shifted turn reports (Result.extra["context_shift"]): the messages dropped and the prompt tokens
    prefilled again; None when nothing was dropped."""
    if not dropped:
        return None
    return {"dropped_messages": dropped, "prefilled_tokens": prompt_tokens - reused}
