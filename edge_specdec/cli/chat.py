"""`edge-specdec chat`: a conversation with a bundle (or the packaged demo) through its chat template, and the
conversation loop that `run --chat` uses too.

On a terminal the loop shows a prompt marker, streams each answer, and takes a few commands (/reset, /exit,
/help); from a pipe it reads one user turn per line and writes only the answers, one per turn, to stdout. Either
way the statistics of each answer go to stderr.
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, TextIO

from ..demo import DEMO_BUNDLE
from ..errors import EdgeSpecdecError
from ..runtime.conversation import answered
from ..runtime.session import ContextOverflowError
from .common import (add_decoding_options, add_engine_options, decoding_settings, open_pipeline, plural,
                     prefill_line, say, stats_line)

CHAT_EXAMPLES = """\
examples:
  edge-specdec chat                                    # the demo pair (a small Python code model)
  edge-specdec chat bundles/qwen --max-new-tokens 512 --temperature 0.7 --seed 1
  printf 'Write a function that reverses a string.\\nNow add a docstring.\\n' | edge-specdec chat bundles/qwen

On a terminal: type a message and press Enter. /reset starts a new conversation, /exit (or Ctrl-D) ends it,
Ctrl-C stops an answer (before it began: the message is left out), and Ctrl-C at the prompt ends the chat. From
a pipe: one user message per line (blank lines are skipped), and only the answers on stdout, each ended by a
newline. Statistics go to stderr.
A turn past the model's context is refused (on a terminal the chat goes on: /reset, or a shorter message; from a
pipe the chat ends with status 1); with --context-shift the oldest exchanges after the system message go instead.
The demo pair is a code model: your message becomes a Python comment, and its answer is the code that follows.
"""

COMMANDS = {"/reset": "start a new conversation (the system message, if any, stays)",
            "/exit": "end the chat (also /quit, Ctrl-D)", "/help": "this list"}


def chat_loop(pipe, config, speculative, system: Optional[str] = None, lines: Optional[TextIO] = None,
              interactive: Optional[bool] = None, out: Optional[TextIO] = None, on_overflow: str = "error") -> int:
    """Hold a conversation: user turns from `lines` (stdin), answers streamed to `out` (stdout). interactive
    (default: whether stdin and stdout are terminals) shows the prompt marker and the greeting, and goes on after
    a turn refused for the context. on_overflow: as for Conversation. Returns the exit status: 0 once the input
    ends or the user leaves."""
    lines = sys.stdin if lines is None else lines
    out = sys.stdout if out is None else out
    if interactive is None:
        interactive = lines.isatty() and out.isatty()
    if pipe.chat_template is None:
        raise EdgeSpecdecError("this bundle's target has no chat template (a base model?): chat needs one. Use "
                               "`edge-specdec run BUNDLE --prompt TEXT` to continue a text instead.")
    chat = pipe.start_chat(system, on_overflow)  # the conversation keeps the KV caches between turns
    if interactive:
        _use_readline()
        say("chat: type a message and press Enter; /reset starts over, /exit or Ctrl-D ends, Ctrl-C stops an answer.")
    while True:
        line = _read_turn(lines, interactive)
        if line is None:
            return 0
        text = line.strip()
        if not text:
            continue
        command = text.split()[0].lower() if text.startswith("/") else None
        if command in ("/exit", "/quit"):
            return 0
        if command == "/reset":
            chat.reset()
            say("chat: a new conversation.")
            continue
        if command == "/help":
            say("\n".join(f"  {name:<7} {what}" for name, what in COMMANDS.items()))
            continue
        try:
            with prefill_line(interactive) as progress:
                # an answer stopped by Ctrl-C stays in the conversation as far as it got (if it began: see below)
                result = chat.ask(line.rstrip("\r\n"), config,
                                  on_text=lambda piece: print(piece, end="", flush=True, file=out),
                                  on_prefill=progress, speculative=speculative)
        except ContextOverflowError as exc:
            if not interactive:
                raise
            say(f"chat: {exc}")
            continue
        print(file=out, flush=True)
        if not answered(result):
            say("chat: stopped before the answer began; the question was left out of the conversation.")
        if "context_shift" in result.extra:
            shifted = result.extra["context_shift"]
            say(f"chat: the {plural(shifted['dropped_messages'], 'oldest message')} went to fit the context; "
                f"{plural(shifted['prefilled_tokens'], 'prompt token')} prefilled again.")
        say(stats_line(result))


def _read_turn(lines: TextIO, interactive: bool) -> Optional[str]:
    """The next line the user typed, or None at the end of the input (Ctrl-D) or on Ctrl-C at the prompt."""
    try:
        if interactive and lines is sys.stdin:
            return input("> ")  # input(): line editing and history through readline
        line = lines.readline()
        return line if line else None
    except EOFError:
        print(file=sys.stderr)
        return None
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return None
    except UnicodeDecodeError as exc:
        raise EdgeSpecdecError(f"the input is not UTF-8 text ({exc.reason}); save it as UTF-8.") from None


def _use_readline() -> None:
    """Line editing and history for input(), where the platform has readline."""
    try:
        import readline  # noqa: F401  (importing it is what turns it on)
    except ImportError:
        pass


def _cmd_chat(args: argparse.Namespace) -> int:
    args.bundle = args.bundle or str(DEMO_BUNDLE)
    config, speculative = decoding_settings(args)
    pipe = open_pipeline(args)
    return chat_loop(pipe, config.with_defaults(pipe.default_config), speculative, system=args.system,
                     on_overflow="shift" if args.context_shift else "error")


def add_parser(sub) -> None:
    """The `chat` subcommand."""
    p = sub.add_parser("chat", help="a conversation with a bundle through its chat template (default: the demo)",
                       description="Chat with the bundle's target, speculatively decoded: each user turn is rendered "
                                   "with the target's chat template together with the conversation so far. "
                                   "Answers stream to stdout, statistics go to stderr.",
                       epilog=CHAT_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundle", metavar="BUNDLE", nargs="?",
                   help="a bundle folder whose target has a chat template (optional; default: the demo pair that "
                        f"ships with edge-specdec, {DEMO_BUNDLE})")
    p.add_argument("--system", metavar="TEXT", help="a system message at the start of the conversation")
    p.add_argument("--context-shift", action="store_true",
                   help="when a turn does not fit in the model's context, drop the oldest exchanges after the system "
                        "message (down to three quarters of the context) instead of refusing the turn")
    add_decoding_options(p, max_new_tokens=256, algorithm_help="default auto; `edge-specdec run --help` explains each")
    add_engine_options(p)
    p.set_defaults(func=_cmd_chat)
