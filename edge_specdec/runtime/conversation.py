"""A conversation on one decoding session: its messages, rendered with the bundle's chat template, its KV caches
kept from turn to turn.

    from edge_specdec import Pipeline
    pipe = Pipeline("bundles/qwen")
    chat = pipe.start_chat(system="You are a terse assistant.")
    print(chat.ask("Write a function that reverses a string.").text)
    result = chat.ask("Now add a docstring.")          # prefills only the new turn
    print(result.text, result.stats.prompt_tokens_reused)

Each turn's prompt is the token ids the model already has (the earlier prompts and the answers exactly as they
were generated) followed by the tokens of the text the template adds after them, so that a template whose
rendering would tokenize an answer otherwise costs nothing. Where the template rewrites earlier text (trims an
answer, drops a part of it), the turn's prompt is the template's whole rendering tokenized afresh, and the cache
keeps what that shares with it. Either way the session reuses its cache (see `DecodingSession.generate`), and a
turn writes exactly what a fresh session writes on the same prompt.

A turn whose prompt and max_new_tokens do not fit in the target's context is refused with the count of tokens over
(on_overflow="error", the default); with on_overflow="shift" the oldest exchanges after the system prompt go instead
(see context_shift.py), and the turn's `result.extra["context_shift"]` says how many messages went and how many
prompt tokens were prefilled again. A turn stopped before its first token (a cancel or Ctrl-C during a long prompt's
prefill) leaves the conversation as it was: `ask`'s question does not join it, and no messages go.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Optional, Protocol

from ..bundle import Bundle
from ..errors import EdgeSpecdecError
from ..vocab_map import VocabMap
from .chat import ChatTemplate
from .context_shift import OVERFLOW_POLICIES, overflow_message, shift, shift_record
from .generate import Result
from .sampling import GenerationConfig
from .session import ContextOverflowError
from .settings import GENERATION_FIELDS, generate_configs
from .text import PromptTokenizer


class ChatEngine(Protocol):
    """What a conversation uses of the engine (pipeline.Engine, which starts conversations): named here rather than
    imported, so that the engine stays the layer above (docs/architecture.md)."""
    bundle: Bundle
    tokenizer: PromptTokenizer
    vocab_map: VocabMap
    chat_template: Optional[ChatTemplate]
    special_token_texts: dict[int, str]
    target_model: Any  # session.CompiledLM: its max_context bounds a conversation
    default_config: GenerationConfig

    def chat_prompt(self, messages: list[dict]) -> list[int]: ...


class ChatSession(Protocol):
    """What a conversation uses of its decoding session (pipeline.DecodingSession)."""

    def generate(self, prompt: list[int], config: Optional[GenerationConfig] = None,
                 on_text: Optional[Callable[[str], Optional[bool]]] = None, **options) -> Result: ...


class Conversation:
    """Messages and the token ids the session's cache was built from. `ask` adds a user turn and answers it;
    `add` appends any message (a tool result, an assistant message written elsewhere); `reset` starts over with
    the system message. on_overflow: "error" refuses a turn past the context, "shift" drops the oldest exchanges
    (`messages` then holds what the model still sees). Not for two threads at once (a lock serializes its turns)."""

    def __init__(self, engine: ChatEngine, session: ChatSession, system: Optional[str] = None,
                 on_overflow: str = "error"):
        if engine.chat_template is None:
            raise EdgeSpecdecError("this bundle's target has no chat template (a base model?): a conversation needs "
                                   "one. Generate from a plain prompt instead.")
        if on_overflow not in OVERFLOW_POLICIES:
            raise EdgeSpecdecError(f"on_overflow must be one of {', '.join(map(repr, OVERFLOW_POLICIES))}, not "
                                   f"{on_overflow!r}.")
        self.engine, self.session = engine, session
        self.system, self.on_overflow = system, on_overflow
        self.messages: list[dict[str, str]] = []
        self.ids: list[int] = []  # the conversation as the model saw it: the last prompt and its answer's tokens
        self._special_text = engine.special_token_texts
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        """A new conversation: only the system message (if any) stays."""
        self.messages = [{"role": "system", "content": self.system}] if self.system else []
        self.ids = []

    def add(self, role: str, content: str) -> None:
        """Append a message without generating (its text reaches the model with the next turn)."""
        self.messages.append({"role": role, "content": content})

    def ask(self, text: str, config: Optional[GenerationConfig] = None,
            on_text: Optional[Callable[[str], Optional[bool]]] = None, **options) -> Result:
        """Add a user message and generate the assistant's answer, which joins the messages. Options as for
        DecodingSession.generate (speculative=SpeculativeConfig(...), a config's fields as keywords, cancel=, ...);
        `result.stats.prompt_tokens_reused` counts the prompt tokens whose KV the session kept from the turns
        before. A turn stopped before its first token leaves the conversation as it was, without the question."""
        with self._lock:
            self.add("user", text)
            try:
                result = self._answer(config, on_text, options)
            except BaseException:  # no answer: the question leaves too, so that the conversation stays as it was
                self.messages.pop()
                raise
            if not answered(result):
                self.messages.pop()
            return result

    def answer(self, config: Optional[GenerationConfig] = None,
               on_text: Optional[Callable[[str], Optional[bool]]] = None, **options) -> Result:
        """Generate the assistant's answer to the messages as they stand (after `add`); options as for `ask`. A turn
        stopped before its first token leaves the messages as they stand."""
        with self._lock:
            return self._answer(config, on_text, options)

    def _answer(self, config, on_text, options) -> Result:
        # a GenerationConfig field given as a keyword (ask(text, max_new_tokens=512)) counts in the fit too
        config = generate_configs(config, None, {name: options.pop(name) for name in list(options)
                                                 if name in GENERATION_FIELDS})[0]
        # the kept messages replace the conversation's only once the turn is answered: a turn that fails, or that
        # is stopped before its first token (during a long prompt's prefill), leaves it as it was, the older
        # messages too
        kept, prompt, dropped = self._fit(self.prompt_ids(), config)
        result = self.session.generate(prompt, config, on_text=on_text, **options)
        if not answered(result):
            return result
        record = shift_record(dropped, result.stats.prompt_tokens_prefilled)
        if record is not None:
            result.extra["context_shift"] = record
        self.messages[:] = kept
        self.messages.append({"role": "assistant", "content": result.text})
        self.ids = prompt + self._tokens_of(result)
        return result

    def prompt_ids(self) -> list[int]:
        """The next turn's prompt: the ids the model has seen, then the tokens of the text the template adds after
        their text; the template's whole rendering when it does not start with that text."""
        rendered = self.engine.chat_template.render(self.messages)
        seen = self._text_of(self.ids)
        if self.ids and rendered.startswith(seen):
            return self.ids + self._encode_more(rendered[len(seen):])
        return self.engine.chat_prompt(self.messages)

    def _fit(self, prompt: list[int], config: Optional[GenerationConfig]) -> tuple[list[dict], list[int], int]:
        """The messages the turn answers, their prompt and the number of messages dropped to fit it with
        max_new_tokens in the context: the messages as they are when they fit; else refused, or (on_overflow
        "shift") the kept messages and their prompt."""
        context = self.engine.target_model.max_context
        defaults = self.engine.default_config
        wanted = (defaults if config is None else config.with_defaults(defaults)).max_new_tokens
        if context is None or len(prompt) + wanted <= context:
            return self.messages, prompt, 0
        if self.on_overflow == "error":
            raise ContextOverflowError(overflow_message(
                context, len(prompt), wanted, "Reset the conversation, lower max_new_tokens, or let it drop its "
                "oldest messages: start_chat(on_overflow='shift'), or `edge-specdec chat --context-shift`."))
        return shift(self.messages, self.engine.chat_prompt, context, wanted)

    def _tokens_of(self, result: Result) -> list[int]:
        """The answer's tokens whose text the answer's text starts with: a final EOS goes (the template writes it
        after the answer), and so do tokens past a stop string's cut."""
        tokens = list(result.token_ids)
        while tokens and not result.text.startswith(self._text_of(tokens)):
            tokens.pop()
        return tokens

    def _text_of(self, ids: list[int]) -> str:
        """The text of token ids with special tokens spelled as the template writes them."""
        pieces = self.engine.vocab_map.target
        out, run = [], bytearray()
        for token in ids:
            piece = pieces.piece(token)
            if piece is None:
                out.append(run.decode("utf-8", "replace"))
                run = bytearray()
                out.append(self._special_text.get(token, ""))
            else:
                run += piece
        out.append(run.decode("utf-8", "replace"))
        return "".join(out)

    def _encode_more(self, text: str) -> list[int]:
        """The tokens of text that continues a prompt (no BOS of their own)."""
        if not text:
            return []
        ids = self.engine.tokenizer.encode(text)
        bos = self.engine.bundle.target.special_tokens.get("bos_token_id")
        if bos is not None and ids[:1] == [bos] and not text.startswith(self._special_text.get(bos, "\0")):
            ids = ids[1:]
        return ids


def answered(result: Result) -> bool:
    """Whether a turn has an answer for the conversation: not one stopped (a cancel, Ctrl-C) before its first token."""
    return bool(result.token_ids) or result.stop_reason not in ("stopped", "interrupted")
