"""A conversation longer than the context: the refusal that says by how much, and the opt-in shift that drops the
oldest exchanges.

An exchange is a user turn (one user message, or several in a row: a document, then the question about it) with
everything that follows it up to the next user turn: the assistant's answer, or its tool calls with their results,
so a tool result never stays without its call. The messages before the first exchange (the system prompt), every
later system or developer message (an instruction for the turns after it) and the last exchange (the question being
answered) always stay. The shift drops exchanges from the oldest on until the prompt fills at most SHIFT_FILL of the
context and leaves room for the tokens wanted, or no more can go; when what always stays leaves no room for the
tokens the answer needs, it refuses.

The kept messages are rendered afresh, so the new prompt shares with the cache only the tokens before the first
dropped message (the system prompt): the session's prefix reuse keeps that KV, which is exact, and prefills the rest
at its new positions. The turn is then what a fresh session writes on the kept messages.
"""
from __future__ import annotations

from typing import Callable, Optional

from .session import ContextOverflowError

OVERFLOW_POLICIES = ("error", "shift")  # refuse a turn past the context, or drop the oldest exchanges
SHIFT_FILL = 0.75  # the share of the context a shifted prompt fills at most, when it can
INSTRUCTION_ROLES = ("system", "developer")  # messages that instruct the turns after them: never dropped


def exchanges(messages: list[dict]) -> tuple[int, list[tuple[int, int]]]:
    """(the number of leading system or developer messages, the [start, end) spans of the exchanges after them).
    An exchange starts at a user message that follows a message of another role; messages before the first user
    message that are not instructions (a greeting) form an exchange of their own."""
    head = 0
    while head < len(messages) and messages[head].get("role") in INSTRUCTION_ROLES:
        head += 1
    starts = [i for i in range(head, len(messages))
              if i == head or (messages[i].get("role") == "user" and messages[i - 1].get("role") != "user")]
    return head, list(zip(starts, starts[1:] + [len(messages)]))


def overflow_message(context: int, prompt_tokens: int, wanted: int, fix: str) -> str:
    """The refusal of a prompt past the context: by how many tokens, and what to do."""
    over = prompt_tokens + wanted - context
    return (f"this model's context is {context} tokens; the prompt has {prompt_tokens} and {wanted} more were asked "
            f"for: {over} tokens over. {fix}")


def shift(messages: list[dict], tokenize: Callable[[list[dict]], list[int]], context: int, wanted: int,
          needed: Optional[int] = None) -> tuple[list[dict], list[int], int]:
    """The messages without their oldest exchanges, down to a prompt of at most SHIFT_FILL of the context with room
    for `wanted` more tokens: (the kept messages, their prompt's token ids, how many messages went). Raises
    ContextOverflowError when what always stays leaves no room for `needed` tokens (default: `wanted`; a request
    that asked for no number needs one, and gets the room left)."""
    head, spans = exchanges(messages)
    needed = wanted if needed is None else needed
    fill = int(context * SHIFT_FILL)
    kept, ids = messages, tokenize(messages)
    for start, _ in spans[1:]:
        if len(ids) <= fill and len(ids) + wanted <= context:
            break
        pinned = [m for m in messages[head:start] if m.get("role") in INSTRUCTION_ROLES]
        kept = messages[:head] + pinned + messages[start:]
        ids = tokenize(kept)
    if len(ids) + needed > context:
        tools = any(m.get("role") == "tool" for m in messages[spans[-1][0]:]) if spans else False
        raise ContextOverflowError(overflow_message(
            context, len(ids), needed, "The system messages and the last user turn"
            + (" with its tool calls and results" if tools else "") + " alone do not fit, even with the older "
            "messages dropped: shorten " + ("a tool result, " if tools else "") + "them"
            + (" or ask for fewer tokens." if needed > 1 else ".")))
    return kept, ids, len(messages) - len(kept)


def shift_record(dropped: int, prefilled: int) -> Optional[dict]:
    """What a shifted turn reports (Result.extra["context_shift"]): the messages dropped and the prompt tokens
    prefilled again (Stats.prompt_tokens_prefilled); None when nothing was dropped."""
    if not dropped:
        return None
    return {"dropped_messages": dropped, "prefilled_tokens": prefilled}
