"""`edge-specdec run`: generate from a bundle (or the packaged demo), one prompt or a chat."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Optional

from ..demo import DEMO_BUNDLE
from ..benchmark import compare
from ..errors import EdgeSpecdecError
from ..runtime.algorithms import DRAFT_TOKENS, algorithms_help
from .chat import chat_loop
from .common import (add_constraint_options, add_decoding_options, add_engine_options, decoding_settings, open_pipeline,
                     prefill_line, say, stats_line)

RUN_EXAMPLES = f"""\
examples:
  edge-specdec run --prompt "def parse_args("        # no bundle: the demo pair that ships with edge-specdec
  edge-specdec run bundles/qwen --prompt "def quicksort(xs):" --max-new-tokens 64
  edge-specdec run bundles/qwen --prompt "def quicksort(xs):" --compare   # + the target alone: speedup, identical?
  edge-specdec run bundles/qwen --prompt-file prompt.txt --algorithm standard --num-assistant-tokens 3 \\
      --confidence 0                      # exactly 3 drafted tokens per round (default: up to {DRAFT_TOKENS}, until unsure)
  echo "Summarize: ..." | edge-specdec run bundles/qwen --prompt - --algorithm prompt-lookup
  edge-specdec run bundles/qwen --prompt "Once" --temperature 0.8 --top-p 0.9 --seed 7 --json
  edge-specdec run bundles/qwen+smollm --prompt "def f(x):" --algorithm tli --temperature 0.7 --top-k 20
  edge-specdec run bundles/qwen --chat                        # a conversation, with the model's chat template
  edge-specdec run bundles/qwen --chat --prompt "Explain Python decorators"   # one chat turn, scriptable
  edge-specdec run bundles/qwen --prompt "..." --draft-device GPU --target-device CPU --allow-fallback

{algorithms_help()}Output is the target's own: identical to --algorithm none under greedy decoding, the same distribution
when sampling.
"""


def _read_prompt(args: argparse.Namespace) -> Optional[str]:
    """The prompt as text: --prompt-file, stdin (--prompt -) or --prompt itself, each checked to be UTF-8.

    Whitespace is text and is generated from, as by the Python API and the server; only an empty prompt is refused.
    """
    if args.prompt_file:
        try:
            with open(args.prompt_file, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise EdgeSpecdecError(f"cannot read --prompt-file {args.prompt_file}: {exc.strerror}.") from None
        prompt = _utf8(data, f"--prompt-file {args.prompt_file}")
    elif args.prompt == "-":
        stdin = getattr(sys.stdin, "buffer", None)
        prompt = _utf8(stdin.read(), "stdin (--prompt -)") if stdin is not None else sys.stdin.read()
        _check_text(prompt, "stdin (--prompt -)")
    elif args.prompt is None:
        if not args.chat:
            raise EdgeSpecdecError("no prompt: pass --prompt TEXT, --prompt - (read stdin), --prompt-file FILE, "
                                   "or --chat for a conversation.")
        return None
    else:
        prompt = args.prompt
        _check_text(prompt, "--prompt")
    if not prompt:
        raise EdgeSpecdecError("the prompt is empty: give some text to continue.")
    return prompt


def _utf8(data: bytes, where: str) -> str:
    """Bytes read as the text files Python opens: UTF-8, with \r\n and \r read as \n (universal newlines)."""
    try:
        return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    except UnicodeDecodeError as exc:
        raise EdgeSpecdecError(f"{where} is not UTF-8 text: byte {exc.start} (0x{data[exc.start]:02x}) "
                               f"{exc.reason}: give UTF-8 text.") from None


def _check_text(text: str, where: str) -> None:
    """Text from argv holds each byte that was not UTF-8 as a lone surrogate (Python's surrogateescape), which the
    tokenizer cannot take: say which byte of the argument it was."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        try:
            raw = text.encode("utf-8", "surrogateescape")  # the bytes as they were given
        except UnicodeEncodeError as exc:  # a surrogate that stands for no byte (given as text, not read)
            raise EdgeSpecdecError(f"{where}: character {exc.start} (U+{ord(text[exc.start]):04X}) is a lone "
                                   f"surrogate, which is not text; remove it.") from None
        _utf8(raw, where)


def _one_shot_is_short(prompt: Optional[str]) -> bool:
    """Whether this run's one prompt cannot reach the long-prompt prefill's threshold: under half as many UTF-8 bytes
    as its tokens (a token holds at least a byte; the other half is left for a chat template). Then --long-prompt-
    precision auto keeps no prefill copy, whose compile and memory the run would pay for nothing."""
    from ..runtime.session import SEQUENCES_AFTER

    return prompt is not None and len(prompt.encode("utf-8", "surrogateescape")) < SEQUENCES_AFTER // 2


def _cmd_run(args: argparse.Namespace) -> int:
    args.bundle = args.bundle or str(DEMO_BUNDLE)
    prompt = _read_prompt(args)
    if args.long_prompt_precision == "auto" and _one_shot_is_short(prompt):
        args.long_prompt_precision = "off"
    config, speculative = decoding_settings(args)
    if args.chat and prompt is None and args.compare:
        raise EdgeSpecdecError("--compare needs one prompt (--prompt, --prompt-file or stdin), not an "
                               "interactive --chat session.")
    pipe = open_pipeline(args, announce=not args.json)
    config = config.with_defaults(pipe.default_config)  # what runs: the options given, else the bundle's defaults
    if args.chat and prompt is None:
        return chat_loop(pipe, config, speculative)
    if args.chat:
        prompt = pipe.chat_prompt([{"role": "user", "content": prompt}])
    if args.compare:
        compare.warm_up(pipe, prompt, config, speculative)
    stream = None if args.json else (lambda text: print(text, end="", flush=True))
    with prefill_line(not args.json) as progress:
        result = pipe.generate(prompt, config, speculative, on_text=stream, on_prefill=progress)
    comparison = compare.against_target_alone(pipe, prompt, config, result) if args.compare else None
    if not result.exact:
        why = pipe.target_model.exactness_note or ("the target's session is not block-invariant: --kv-rollback "
                                                   "masked, or a device that failed the check")
        say(f"edge-specdec: warning: this run is exact only up to float noise ({why}); a near-tie can give "
            "another token than the target alone. The default paged rollback and KV cache on the CPU are bit-exact.")
    if args.json:
        pieces = pipe.vocab_map.target
        print(json.dumps({**result.to_dict(lambda t: (pieces.piece(t) or b"").decode("utf-8", "replace")),
                          "placement": vars(pipe.placement), "load_seconds": round(pipe.load_seconds, 3),
                          **({"compare": comparison} if comparison else {})},
                         ensure_ascii=False))
    else:
        print()
        if result.logprobs is not None:
            say(_logprobs_lines(result, pipe.vocab_map.target))
        say(stats_line(result))
        if comparison:
            say(compare.compare_line(comparison, result.extra["algorithm"]))
    return 130 if result.stop_reason == "interrupted" else 0


def _logprobs_lines(result, pieces) -> str:
    """One line per output token: its text, its log-probability, and the best alternatives."""
    def shown(token: int) -> str:
        return repr((pieces.piece(token) or b"").decode("utf-8", "replace"))

    return "\n".join(f"{shown(lp.token)} {lp.logprob:.4f}" + "".join(f"  {shown(t)} {v:.4f}" for t, v in lp.top)
                     for lp in result.logprobs)


def add_parser(sub) -> None:
    """The `run` subcommand."""
    p = sub.add_parser("run", help="generate text from a bundle, with speculative decoding",
                       description="Generate with the bundle's target, drafting with its draft model or prompt "
                                   "lookup. Text streams to stdout, statistics go to stderr.",
                       epilog=RUN_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundle", metavar="BUNDLE", nargs="?",
                   help="a bundle folder written by `edge-specdec export` (optional; default: the demo pair that "
                        f"ships with edge-specdec, {DEMO_BUNDLE}, a 6.8M-parameter Python code model)")
    p.add_argument("--prompt", metavar="TEXT", help="the prompt; - reads it from stdin")
    p.add_argument("--prompt-file", metavar="FILE", help="read the prompt from a file")
    p.add_argument("--chat", action="store_true",
                   help="apply the target's chat template; without a prompt, an interactive conversation")
    add_decoding_options(p)
    add_engine_options(p)
    p.add_argument("--compare", action="store_true",
                   help="then run the target alone on the same prompt and print the speedup and whether the "
                        "output is identical (each side runs once untimed first, as in the benchmark: about four "
                        "times as long in all)")
    p.add_argument("--logprobs", nargs="?", type=int, const=0, metavar="N",
                   help="report the target's log-probability of each output token (and the N most likely tokens "
                        "at each position, N up to 20): one line per token on stderr, or 'logprobs' in --json. "
                        "On a bit-exact session every algorithm gives the target alone's bits")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object: text, token_ids, stop_reason, exact, stats (and logprobs, compare)")
    add_constraint_options(p)
    p.set_defaults(func=_cmd_run)
