"""The conversation suite: a multi-turn chat and requests sharing a system prompt, the time to the first token with
prefix reuse, without it, and in OpenVINO GenAI's chat mode; with --document-tokens, a chat about a long document
(questions after it, each turn reusing the document and the answers before)."""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from ..suite_runs import Cell, Figure, Measured, Suite, SuiteRow

SUMMARY = "a multi-turn chat and requests sharing a system prompt: time to the first token with prefix reuse"

TURNS = [
    "Write a Python function that parses a line of a CSV file into a list of fields, with quoted fields.",
    "Now make it handle escaped quotes inside quoted fields.",
    "Add type hints and a docstring with two examples.",
    "Write three pytest tests for it.",
    "Now write a function that uses it to read a whole file into a list of dicts keyed by the header.",
    "Make that one a generator, and explain the change in one sentence.",
    "Add error handling for a row with the wrong number of fields.",
    "Summarize what the code does in three bullet points.",
]
SYSTEM = ("You are a senior Python engineer who reviews code for a team that builds data pipelines. "
          "House rules: " + " ".join(f"Rule {i}: prefer the standard library, name things for what they do, "
                                         f"write a docstring for every public function, keep functions short, "
                                         f"and test edge cases such as empty input and unicode text."
                                         for i in range(1, 13)))
QUESTIONS = ["How should I name a function that loads a config file?", "Is a dataclass right for a settings object?",
             "When should I use a generator instead of a list?", "How do I test code that reads the clock?",
             "What is a good way to log errors in a CLI?", "Should I catch Exception in a worker thread?",
             "How do I make a script's output stable across runs?", "When is a global constant fine?"]
REQUEST_TOKENS = 32  # a service request's answer
# the chat's turns about a document (--document-tokens): the first turn holds the document, then its question
DOCUMENT_TURNS = [
    "Summarize the code above in three sentences.",
    "Which function in it does the most work, and what does it do?",
    "Write a docstring for that function.",
    "What would you test first in this code, and how?",
    "Name one thing you would rename, and why.",
    "List the modules it imports and what each is used for.",
    "Suggest one way to make it faster.",
    "Summarize our conversation in two sentences.",
]

FIGURES = [Figure("later_ttft_s", "TTFT s from turn 2", ".3f", lower_is_better=True),
           Figure("ttft_s", "TTFT s", ".3f", lower_is_better=True),
           Figure("seconds", "s per turn", ".2f", lower_is_better=True),
           Figure("prompt_tokens", "prompt tokens", ".0f"),
           Figure("reused_tokens", "tokens reused", ".0f")]

METHOD = ("Two patterns, the rows interleaved turn by turn in one process, each row keeping its own conversation: a "
          "chat (coding questions that build on each other; ours through `Engine.start_chat`, one session whose "
          "caches stay, GenAI's `LLMPipeline` in chat mode, which keeps its KV cache between turns), then a service "
          "(requests sharing a long system prompt, each with its own question; ours on one session as a server slot, "
          "GenAI's plain `generate` on the same rendered text). The baseline is ours with "
          "`EngineConfig(prefix_reuse=False)`: every turn prefilled whole. TTFT from turn 2: the first turn and the "
          "first request prefill everything in every row. With --document-tokens N the chat is about a document "
          "instead: its first turn holds about N tokens of this package's own sources in a code fence, then a "
          "question, and the later turns ask about it. With --prefix-store a row runs the chat as a server slot with "
          "a prefix store: before each turn from the second, another conversation's request takes the slot and the "
          "store brings the chat's caches back, which its time to the first token counts.")


class OursChat:
    """Our chat and service on one engine: each run the time to the first token and the answer's token ids."""

    def __init__(self, engine, answer_tokens: int):
        from ...runtime import GenerationConfig

        self.engine, self.chat, self.session = engine, None, engine.session()
        self.turn_config = GenerationConfig(max_new_tokens=answer_tokens)
        self.request_config = GenerationConfig(max_new_tokens=REQUEST_TOKENS)

    def run(self, c: Cell, repeat: int) -> Measured:
        kind, index, text = c.value
        if kind == "chat":
            self.before_turn(index, text)
        first: list[float] = []
        start = time.perf_counter()
        if kind == "chat":
            result = self.turn(index, text, on_text=lambda _: first or first.append(time.perf_counter()))
            prompt_tokens = len(self.chat.ids) - len(result.token_ids)
        else:
            ids = self.engine.chat_prompt([{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}])
            result = self.session.generate(ids, self.request_config,
                                           on_text=lambda _: first or first.append(time.perf_counter()))
            prompt_tokens = len(ids)
        end = time.perf_counter()
        ttft = (first[0] if first else end) - start
        return Measured({"ttft_s": ttft, "later_ttft_s": ttft if index else None, "seconds": end - start,
                         "prompt_tokens": prompt_tokens, "reused_tokens": result.stats.prompt_tokens_reused},
                        list(result.token_ids))

    def before_turn(self, index: int, text: str) -> None:
        """What happens before a chat turn, untimed (nothing here)."""

    def turn(self, index: int, text: str, on_text):
        """The chat turn, timed: the question asked and answered (the first one in a new chat)."""
        if index == 0:
            self.chat = self.engine.start_chat()
        return self.chat.ask(text, self.turn_config, on_text=on_text)


class OursStoredChat(OursChat):
    """Our chat as a server slot with a prefix store (`serve --prefix-cache-mb`): before each turn from the second on,
    another conversation's request takes the chat's session, so the chat's caches go to the store, and the turn gets
    them back (and the other request's go in, as a server's slot does). Its time to the first token counts those
    copies, not the other request."""

    def __init__(self, engine, answer_tokens: int):
        from ...serve.prefix_store import PrefixStore

        super().__init__(engine, answer_tokens)
        self.store = PrefixStore(max_bytes=1 << 40)  # no bound: the chat and the other requests' short caches

    def before_turn(self, index: int, text: str) -> None:
        if index:
            slot = self.chat.session
            other = self.engine.chat_prompt([{"role": "user", "content": QUESTIONS[index % len(QUESTIONS)]}])
            self.store.prepare(slot, other)  # the other conversation takes the slot: the chat's caches to the store
            slot.generate(other, self.request_config)
            self.chat.add("user", text)

    def turn(self, index: int, text: str, on_text):
        if not index:
            return super().turn(index, text, on_text)
        if not self.store.prepare(self.chat.session, self.chat.prompt_ids()).restored:
            raise RuntimeError("the prefix store did not give the chat's caches back")
        return self.chat.answer(self.turn_config, on_text=on_text)


class GenAIChat:
    """OpenVINO GenAI's LLMPipeline on the bundle's target folder: chat mode for the chat, plain generate calls on
    the rendered text for the service."""

    def __init__(self, og, engine, answer_tokens: int):
        self.og, self.engine, self.answer_tokens = og, engine, answer_tokens
        self.pipe = og.LLMPipeline(str(engine.bundle.target.folder), "CPU")
        self.chatting = False

    def _timed(self, prompt: str, config) -> tuple[float, float]:
        first: list[float] = []
        start = time.perf_counter()
        self.pipe.generate(prompt, config, lambda _: bool(first or first.append(time.perf_counter())))
        end = time.perf_counter()
        return (first[0] if first else end) - start, end - start

    def run(self, c: Cell, repeat: int) -> Measured:
        kind, index, text = c.value
        if self.chatting and (kind != "chat" or index == 0):
            self.pipe.finish_chat()
            self.chatting = False
        if kind == "chat":
            if not self.chatting:
                self.pipe.start_chat()
                self.chatting = True
            ttft, seconds = self._timed(text, self.og.GenerationConfig(max_new_tokens=self.answer_tokens))
        else:
            config = self.og.GenerationConfig(max_new_tokens=REQUEST_TOKENS)
            config.apply_chat_template = False  # the prompt is rendered already, as ours is
            messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
            ttft, seconds = self._timed(self.engine.chat_template.render(messages), config)
        return Measured({"ttft_s": ttft, "later_ttft_s": ttft if index else None, "seconds": seconds})


def conversation_cells(turns: int, service: int, document: str = "") -> list[Cell]:
    """The chat's turns, then the service's requests; with a document, the chat is about it: its first turn holds
    the document, then the first question."""
    texts = DOCUMENT_TURNS[:turns] if document else TURNS[:turns]
    texts = [document + texts[0], *texts[1:]] if document else texts
    return ([Cell(f"turn {i + 1}", ("chat", i, text)) for i, text in enumerate(texts)]
            + [Cell(f"request {j + 1}", ("service", j, q)) for j, q in enumerate(QUESTIONS[:service])])


def document_text(engine, tokens: int) -> str:
    """About `tokens` tokens of the target's of a long text (this package's own Python sources, as the long-prompt
    suite cuts them), in a code fence, with a blank line after it."""
    from ...runtime.text import decode
    from .long_prompts import long_text

    ids = engine.tokenizer.encode(long_text(), add_special=False)
    if len(ids) < tokens:
        raise RuntimeError(f"the text has only {len(ids)} tokens, fewer than {tokens}")
    return "```python\n" + decode(engine.vocab_map.target, ids[:tokens]) + "\n```\n\n"


def conversation_rows(args: argparse.Namespace, reuse, whole) -> tuple[list[SuiteRow], list[dict]]:
    """The suite's rows on the engine with prefix reuse and the one without, and the rows skipped (GenAI's, where
    openvino_genai is missing)."""
    from ..suite_runs import genai_or_reason, stderr_say

    rows = [SuiteRow("ours-reuse", "ours, prefix reuse on (the default): a turn prefills only its new tokens",
                     OursChat(reuse, args.answer_tokens).run, reference="ours-no-reuse"),
            SuiteRow("ours-no-reuse", "ours with EngineConfig(prefix_reuse=False): every turn prefilled whole",
                     OursChat(whole, args.answer_tokens).run)]
    if args.prefix_store:
        rows.insert(1, SuiteRow("ours-store", "ours as a server slot with a prefix store: before each turn from the "
                                "second, another conversation takes the session and the store brings the chat's caches "
                                "back", OursStoredChat(reuse, args.answer_tokens).run, reference="ours-no-reuse"))
    skipped = []
    if not args.no_genai:
        og, reason = genai_or_reason()
        if og is not None:
            rows.append(SuiteRow("genai-chat", "OpenVINO GenAI LLMPipeline, chat mode (start_chat) for the chat, "
                                 "generate on the rendered text for the service", GenAIChat(og, reuse,
                                                                                            args.answer_tokens).run))
        else:
            stderr_say(f"skipping genai-chat: {reason}")
            skipped.append({"setup": "genai-chat", "reason": reason})
    return rows, skipped


def main(args: argparse.Namespace) -> int:
    from ...errors import EdgeSpecdecError
    from ...runtime import Engine
    from ..suite_runs import check_out, finish, run_suite

    if not 1 <= args.turns <= len(TURNS) or not 0 <= args.service <= len(QUESTIONS):
        raise EdgeSpecdecError(f"--turns takes 1 to {len(TURNS)} and --service 0 to {len(QUESTIONS)}.")
    if args.answer_tokens < 1 or args.repeats < 1 or args.document_tokens < 0:
        raise EdgeSpecdecError("--answer-tokens and --repeats must be at least 1, and --document-tokens at least 0.")
    out = Path(args.out) if args.out else None
    check_out(out)
    # no draft pool: a repeat must not copy the answers of the repeat before it (the request's own text still
    # gives free drafts, the conversation's history among it)
    reuse, whole = Engine(args.bundle, draft_pool_tokens=0), Engine(args.bundle, prefix_reuse=False,
                                                                  draft_pool_tokens=0)
    for engine in (reuse, whole):  # timed as a server runs once its copies serve, not while they compile
        engine.compile_static_copies()
    if reuse.chat_template is None:
        raise EdgeSpecdecError(f"{args.bundle}: the target has no chat template, and the conversation suite "
                               f"measures chats; try the general suite.")
    rows, skipped = conversation_rows(args, reuse, whole)
    document = document_text(reuse, args.document_tokens) if args.document_tokens else ""
    cells = conversation_cells(args.turns, args.service, document)
    system_tokens = len(reuse.chat_prompt([{"role": "system", "content": SYSTEM}]))
    suite = Suite("conversation", reuse.bundle, rows, cells, FIGURES, headline="later_ttft_s",
                  baseline="ours-no-reuse", method=METHOD, repeats=args.repeats, warm_ups=cells[:1], skipped=skipped,
                  settings={"turns": args.turns, "answer_tokens": args.answer_tokens, "service": args.service,
                            "request_tokens": REQUEST_TOKENS, "system_prompt_tokens": system_tokens,
                            "document_tokens": args.document_tokens})
    return finish(run_suite(suite, out, args.command_line))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = __doc__
    p.epilog = ("examples:\n  edge-specdec bench conversation bundles/qwen+smollm --turns 6 --service 8\n"
                "  edge-specdec bench conversation bundles/qwen+smollm --document-tokens 4000 --service 0")
    p.add_argument("--turns", type=int, default=6, metavar="N", help=f"user turns of the chat (default 6, at most "
                   f"{len(TURNS)})")
    p.add_argument("--answer-tokens", type=int, default=160, metavar="N",
                   help="tokens per answer in the chat (default 160)")
    p.add_argument("--service", type=int, default=8, metavar="N",
                   help=f"requests sharing a system prompt, {REQUEST_TOKENS} tokens each (default 8; 0: none)")
    p.add_argument("--repeats", type=int, default=1, metavar="N",
                   help="times the whole conversation runs, after one warm-up turn (default 1)")
    p.add_argument("--document-tokens", type=int, default=0, metavar="N",
                   help="a chat about a document of about N tokens (this package's sources), which its first turn "
                   "holds, then questions about it (default 0: the coding chat)")
    p.add_argument("--prefix-store", action="store_true",
                   help="add a row where another conversation takes the chat's session before each turn and the "
                   "server's prefix store (serve --prefix-cache-mb) brings the chat's caches back")
    p.add_argument("--no-genai", action="store_true", help="leave out OpenVINO GenAI's row")
