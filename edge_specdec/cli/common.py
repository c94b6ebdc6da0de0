"""What the subcommands share: messages on stderr, help texts, the engine options used by more than one, the
decoding options of run and chat, and the statistics line they print."""
from __future__ import annotations

import argparse
import re
import sys
from contextlib import contextmanager
from typing import Iterator, Optional, TextIO

from ..runtime.algorithms import ALGORITHMS, CONFIDENCE, DRAFT_TOKENS, LOOKUP_TOKENS
from ..runtime.devices import AUTO_PREFILL_RATIO, KV_CACHES, LONG_PROMPT_PRECISIONS, NPU_MAX_PROMPT, PRECISIONS
from ..runtime.draft_window import DRAFT_WINDOW, MIN_WINDOW
from ..runtime.drafters import DRAFT_POLICIES
from ..runtime.generate import PrefillProgress
from ..runtime.session import ROLLBACK_METHODS
from ..runtime.settings import DRAFT_VOCAB, SMALL_MODEL_BYTES
from ..runtime.suffix import DRAFT_POOL_TOKENS


def say(message: str) -> None:
    """A message for the person at the terminal (stderr), so that stdout holds only the output."""
    print(message, file=sys.stderr, flush=True)


class PrefillLine:
    """A long prompt's prefill progress on a terminal (Pipeline.generate's on_prefill): one line on stderr, shown
    between the prefill's calls where it takes several, rewritten at each, and erased once the prefill is done (the
    text comes after that) or by `clear` where a run ends otherwise (stopped, failed), before other output."""

    def __init__(self, stream: TextIO):
        self.stream, self.shown = stream, False

    def __call__(self, progress: PrefillProgress) -> None:
        done, total = progress.done, progress.total
        if done >= total:
            self.clear()
        elif done > progress.cached:  # (the prefill's start is not shown: most prompts take one call)
            self.stream.write(f"\r\033[Kprefilling the prompt: {done} of {total} tokens ({100 * done // total} %)")
            self.stream.flush()
            self.shown = True

    def clear(self) -> None:
        if self.shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.shown = False


@contextmanager
def prefill_line(shown: bool = True) -> Iterator[Optional[PrefillLine]]:
    """A PrefillLine for one run where it is shown and stderr is a terminal, None where not (a log or a pipe keeps
    no such line); erased when the run ends, however it ends (a run that wrote no text, stopped or failed)."""
    line = PrefillLine(sys.stderr) if shown and sys.stderr.isatty() else None
    try:
        yield line
    finally:
        if line is not None:
            line.clear()


def plural(count: int, noun: str, nouns: str = "") -> str:
    """'1 round', '3 rounds': a count with its noun in the right number (nouns: an irregular plural)."""
    return f"{count} {noun if count == 1 else nouns or noun + 's'}"


DRAFT_VOCAB_HELP = ("the draft computes logits only for its first N token ids and its special tokens: a smaller "
                    f"output layer, a faster draft step (default {DRAFT_VOCAB}; 0 = its whole vocabulary). The output "
                    "stays exact either way.")


def add_engine_options(p: argparse.ArgumentParser) -> None:
    """Where and how the engine runs, as run, serve and check take it: the devices, the compiled-model cache,
    CPU threads and arithmetic, the draft's vocabulary cut, checksums (see engine_config)."""
    p.add_argument("--target-device", default="AUTO", metavar="DEV",
                   help="CPU, GPU, GPU.N, NPU or AUTO (default: a discrete GPU if any, else the CPU)")
    p.add_argument("--draft-device", default="AUTO", metavar="DEV",
                   help="CPU, GPU, GPU.N, NPU or AUTO (default: an integrated GPU or the NPU if any, where a draft "
                        "step is timed against the CPU's once per machine and bundle, and the faster kept)")
    p.add_argument("--allow-fallback", action="store_true",
                   help="if a device asked for is absent, run on the CPU instead of failing")
    p.add_argument("--cache-dir", metavar="DIR",
                   help="OpenVINO compiled-model cache (default ~/.cache/edge-specdec/ov-cache or "
                        "$EDGE_SPECDEC_CACHE_DIR; 'off' disables it)")
    p.add_argument("--threads", type=int, metavar="N",
                   help=f"CPU threads per model (default: 1 for a model under {SMALL_MODEL_BYTES >> 20} MB, whose "
                        f"narrow layers lose more to thread barriers than they gain; else all cores, or half each "
                        f"with --concurrent)")
    p.add_argument("--precision", default="dq", choices=PRECISIONS,
                   help="CPU arithmetic: dq = dynamic int8 activations, in groups as large as the int4 weights' "
                        "groups (the default: faster), f32 = plain float32, closest to the "
                        "original model. The speculative output equals the target alone's under the same setting "
                        "either way.")
    p.add_argument("--kv-cache", choices=KV_CACHES, metavar="TYPE",
                   help="the KV cache's element type: f32, f16 (the CPU's default: half of f32's memory, as exact) "
                        "or u8 (about a quarter of f32's, not block-invariant: the output is then exact only up to "
                        "float noise, and the run says so); `edge-specdec check` shows the bytes per token")
    p.add_argument("--long-prompt-precision", choices=LONG_PROMPT_PRECISIONS, default="auto", metavar="PRECISION",
                   help="prefill prompts of 1024 tokens or more on a copy of the target at this precision: bf16 "
                        "takes about 0.6x the time to the first token on CPUs with AMX, and the copy holds the "
                        "target's weights again but its output layer (about 0.8 GiB more for a 1.5B int4 target, and "
                        "4 s more load). Exact: the target alone prefills the same way. Needs the f16 KV cache (the "
                        "default). auto (the default): bf16 where it pays, that is a target of 256 MB or more on a "
                        "CPU with bf16 whose copy, timed once per machine and bundle, prefills a 2048-token prompt in "
                        f"at most {AUTO_PREFILL_RATIO}x the target's time (AMX: yes; AVX-512 BF16 alone: yes, about "
                        "0.87x there and 0.78x at 8192 tokens; most AVX2 CPUs: no bf16), and never for a one-shot "
                        "`run` prompt too short to use it; `edge-specdec check` says which. off: the target prefills "
                        "every prompt (the least memory)")
    p.add_argument("--draft-vocab", type=int, default=DRAFT_VOCAB, metavar="N", help=DRAFT_VOCAB_HELP)
    p.add_argument("--npu-max-prompt", type=int, default=NPU_MAX_PROMPT, metavar="N",
                   help=f"the longest prompt, in tokens, a model on the NPU is compiled for (default "
                        f"{NPU_MAX_PROMPT}; the NPU compiles static shapes, and a longer prompt is refused)")
    p.add_argument("--draft-pool-tokens", type=int, default=DRAFT_POOL_TOKENS, metavar="N",
                   help=f"remember up to N tokens of earlier requests' prompts and outputs in memory, from which "
                        f"later requests copy free drafts (text that recurs across requests: many requests of one "
                        f"shape, a tool-call loop); default {DRAFT_POOL_TOKENS}")
    p.add_argument("--no-draft-pool", action="store_true",
                   help="keep no draft pool (free drafts still copy from each request's own text)")
    p.add_argument("--no-verify", action="store_true",
                   help="skip the sha256 checks of the bundle's files, which otherwise run at every load while the "
                        "models compile (sizes are still checked): damaged or tampered weights then load silently")


def engine_config(args: argparse.Namespace, **more):
    """The EngineConfig of the options add_engine_options added, and of `more` (a subcommand's own settings)."""
    from ..runtime.settings import EngineConfig

    return EngineConfig(target_device=args.target_device, draft_device=args.draft_device,
                        allow_fallback=args.allow_fallback, cache_dir=args.cache_dir, threads=args.threads,
                        precision=args.precision, kv_cache=args.kv_cache,
                        long_prompt_precision=args.long_prompt_precision, draft_vocab=args.draft_vocab,
                        npu_max_prompt=args.npu_max_prompt, verify_checksums=not args.no_verify,
                        draft_pool_tokens=0 if args.no_draft_pool else args.draft_pool_tokens, **more)


def add_chat_template_option(p: argparse.ArgumentParser) -> None:
    """--chat-template FILE, as run, chat and serve take it (EngineConfig.chat_template)."""
    p.add_argument("--chat-template", metavar="FILE",
                   help="render conversations with this Jinja chat template instead of the bundle's (as "
                        "llama-server's --chat-template-file); the bundle is not changed and still verifies. "
                        "`edge-specdec info` says whether a template describes tools and a system message")


def add_decoding_options(p: argparse.ArgumentParser, max_new_tokens: int = 128,
                         algorithm_help: str = "see below (default auto)") -> None:
    """How run and chat decode: the algorithm and its drafting, sampling and stopping, the engine's rollback
    and concurrency (see decoding_settings), and the chat template."""
    add_chat_template_option(p)
    p.add_argument("--max-new-tokens", type=int, default=max_new_tokens, metavar="N",
                   help=f"tokens to generate (default {max_new_tokens})")
    p.add_argument("--algorithm", default="auto", choices=ALGORITHMS, help=algorithm_help)
    p.add_argument("--num-assistant-tokens", type=int, metavar="K",
                   help=f"the most tokens drafted per round (the first K of the adaptive policies; default "
                        f"{DRAFT_TOKENS} with a draft model, {LOOKUP_TOKENS} for prompt lookup)")
    p.add_argument("--confidence", type=float, metavar="P",
                   help=f"a draft model stops drafting after a token whose top probability is under P (default "
                        f"{CONFIDENCE}; 0 drafts K tokens every round)")
    p.add_argument("--draft-policy", default="fixed", choices=DRAFT_POLICIES,
                   help="how K changes: fixed (the default); schedule: +2 after a fully accepted round, -1 "
                        "otherwise; cost: the K that maximizes tokens/s from the acceptance and the draft and "
                        "target costs measured during the run (K=0, the target alone, when drafting does not pay)")
    p.add_argument("--adaptive", action="store_true", help="the same as --draft-policy schedule")
    p.add_argument("--draft-window", type=int, metavar="N",
                   help=f"the draft model reads at most N tokens: a longer prompt and output are read through a "
                        f"window, their first tokens and their last, that slides in large steps (the target still "
                        f"checks every token). Default {DRAFT_WINDOW}, or the draft's context if shorter; 0 = no "
                        f"window (the draft stops drafting once the text outgrows its context); else at least "
                        f"{MIN_WINDOW}")
    p.add_argument("--no-lookup", action="store_true",
                   help="let the draft model draft every round (by default a round first looks for the next "
                        "tokens in the prompt, the output and earlier requests, and proposes a copy without running "
                        "the draft when one is likely to be kept: text that repeats, such as code being edited or a "
                        "quoted document, goes faster)")
    # sampling options left out take the bundle's defaults (`edge-specdec info` shows them), else these
    p.add_argument("--temperature", type=float, help="0 = greedy (the default, unless the bundle records another)")
    p.add_argument("--top-k", type=int, help="sample from the K most likely tokens (0 = off, the default)")
    p.add_argument("--top-p", type=float, help="nucleus sampling mass (1.0 = off, the default)")
    p.add_argument("--seed", type=int, help="random seed for sampling")
    p.add_argument("--repetition-penalty", type=float, metavar="R",
                   help="divide the logits of tokens already in the text by R (Hugging Face semantics; 1.0 = off). "
                        "Default: the bundle's (the demo pair's is 1.2, which keeps its tiny target from repeating "
                        "itself), else off")
    p.add_argument("--min-p", type=float, metavar="P",
                   help="drop tokens less likely than P times the most likely one (0 = off, the default)")
    p.add_argument("--presence-penalty", type=float, metavar="X",
                   help="subtract X from the logit of every token the output already holds (OpenAI semantics: the "
                        "prompt does not count; -2 to 2, 0 = off)")
    p.add_argument("--frequency-penalty", type=float, metavar="X",
                   help="subtract X times its count in the output from each token's logit (OpenAI semantics; "
                        "-2 to 2, 0 = off)")
    p.add_argument("--logit-bias", action="append", metavar="ID+BIAS", type=logit_bias_option,
                   help="add BIAS (-100 to 100) to the logit of target token ID, as llama.cpp writes it: 15043+1, "
                        "15043-100 (repeatable)")
    p.add_argument("--stop", action="append", metavar="TEXT", help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-sequence token")
    p.add_argument("--concurrent", action=argparse.BooleanOptionalAction, default=None,
                   help="draft the next round while the target verifies (default: on when draft and target sit "
                        "on different devices; on one CPU each model then gets half of the cores)")
    p.add_argument("--kv-rollback", choices=ROLLBACK_METHODS,
                   help="how the KV cache forgets rejected tokens: paged (default on CPU/GPU: paged-attention "
                        "IR, bit-exact) or masked (stateful IR with attention-mask rollback, always f32)")


def logit_bias_option(text: str) -> tuple[int, float]:
    """--logit-bias ID+BIAS or ID-BIAS (llama.cpp's spelling) as (token id, bias)."""
    match = re.fullmatch(r"\s*(\d+)\s*([+-].+)", text)
    try:
        return int(match.group(1)), float(match.group(2))
    except (AttributeError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not TOKEN_ID+BIAS or TOKEN_ID-BIAS (such as 15043+1 or "
                                         f"15043-100)") from None


def add_constraint_options(p: argparse.ArgumentParser) -> None:
    """Structured output: at most one constraint the output must match (see docs/usage.md)."""
    group = p.add_argument_group("structured output (at most one; every algorithm stays exact under it)")
    one = group.add_mutually_exclusive_group()
    one.add_argument("--json-schema", metavar="FILE", help="the output is JSON that fits this JSON schema")
    one.add_argument("--json-object", action="store_true", help="the output is a JSON object")
    one.add_argument("--regex", metavar="PATTERN", help="the whole output matches this regular expression")
    one.add_argument("--grammar", metavar="FILE", help="the output follows this grammar: Lark (its first rule "
                                                       "`start:`) or GBNF (`root ::= ...`, as llama.cpp writes it)")


def constraint_option(args: argparse.Namespace):
    """The Constraint that add_constraint_options' options ask for, or None; a file that cannot be read or a schema
    that is not JSON is a one-line error."""
    import json
    from pathlib import Path

    from ..errors import EdgeSpecdecError
    from ..runtime.constraint import Constraint

    def read(option: str, path: str) -> str:
        try:
            return Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise EdgeSpecdecError(f"{option} {path}: cannot read it ({exc.strerror or exc}).") from None

    if getattr(args, "json_schema", None):
        try:
            return Constraint.json_schema(json.loads(read("--json-schema", args.json_schema)))
        except ValueError as exc:
            raise EdgeSpecdecError(f"--json-schema {args.json_schema}: not JSON ({exc}).") from None
    if getattr(args, "json_object", False):
        return Constraint.json_object()
    if getattr(args, "regex", None) is not None:
        return Constraint.regex(args.regex)
    if getattr(args, "grammar", None):
        return Constraint.grammar(read("--grammar", args.grammar))
    return None


def decoding_settings(args: argparse.Namespace):
    """The GenerationConfig (validated here, before anything loads) and the SpeculativeConfig of
    add_decoding_options' options. A sampling option left out is not set in the config, so that it takes the
    bundle's default, as a GenerationConfig field left unset does in the Python API."""
    from ..runtime import GenerationConfig
    from ..runtime.settings import SpeculativeConfig

    sampling = {name: getattr(args, name) for name in ("temperature", "top_k", "top_p", "repetition_penalty",
                                                   "min_p", "presence_penalty", "frequency_penalty")
                if getattr(args, name) is not None}
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, seed=args.seed, stop_strings=args.stop or [],
                              ignore_eos=args.ignore_eos, logprobs=getattr(args, "logprobs", None) is not None,
                              top_logprobs=getattr(args, "logprobs", None) or 0, constraint=constraint_option(args),
                              **sampling, **({"logit_bias": dict(args.logit_bias)} if args.logit_bias else {}))
    config.validate()
    if config.constraint is not None:  # a schema feature or a pattern the grammar engine refuses, before the load
        from ..runtime.grammar import constraint_problem
        problem = constraint_problem(config.constraint)
        if problem:
            from ..errors import EdgeSpecdecError
            raise EdgeSpecdecError(problem)
    speculative = SpeculativeConfig(algorithm=args.algorithm, num_assistant_tokens=args.num_assistant_tokens,
                                    draft_policy="schedule" if args.adaptive else args.draft_policy,
                                    confidence=args.confidence, lookup=not args.no_lookup,
                                    draft_window=args.draft_window)
    return config, speculative


def open_pipeline(args: argparse.Namespace, announce: bool = True):
    """The Pipeline of args.bundle with the engine and decoding options given; announce: say on stderr what runs
    where."""
    from ..runtime import Pipeline

    if announce:  # one progress line: what loads, then how long it took
        print(f"edge-specdec: loading {args.bundle} ...", end="", file=sys.stderr, flush=True)
    # no static copies: they pay back their compile over many requests (serve), not over one run or a chat
    try:
        pipe = Pipeline(args.bundle, config=engine_config(args, kv_rollback=args.kv_rollback,
                                                          concurrent=args.concurrent, static_shapes=False,
                                                          chat_template=args.chat_template))
    except BaseException:
        if announce:  # the progress line ends before the error's own line
            say(" failed.")
        raise
    if announce:
        say(f" {pipe.load_seconds:.1f} s; {pipe.placement.describe()}"
            + ("; draft runs concurrently" if pipe.concurrent else "")
            + (f"; {pipe.long_prompt_note}" if pipe.long_prompt_note else ""))
    return pipe


def stats_line(result) -> str:
    """The statistics of one generation, in one line for stderr."""
    st = result.stats.as_dict()
    # the prompt's prefill apart from decoding (after a long prompt the run's own rate is mostly the prefill's)
    first = (f" (the first after {st['first_token_seconds']:.2f} s, "
             f"{plural(st['prompt_tokens_prefilled'], 'prompt token')} prefilled; then "
             f"{1000 / st['time_per_output_token_ms']:.1f} tokens/s)"
             if st["new_tokens"] > 1 and st["first_token_seconds"] and st["time_per_output_token_ms"] else "")
    line = (f"[{result.extra['algorithm']}] {plural(st['new_tokens'], 'token')} in {st['seconds']:.2f} s = "
            f"{st['tokens_per_s']:.1f} tokens/s{first}; "
            f"{plural(st['target_passes'], 'target pass', 'target passes')}, "
            f"{st['mean_tokens_per_target_pass']:.2f} tokens per pass; acceptance {st['acceptance']:.2f} "
            f"({st['draft_tokens_accepted']}/{st['draft_tokens_proposed']}); time: draft {st['draft_seconds']:.2f} s, "
            f"target {st['target_seconds']:.2f} s, loop {st['loop_seconds']:.2f} s; stop: {result.stop_reason}")
    copied = st["suffix_tokens_accepted"] + st["pool_tokens_accepted"]
    if st["suffix_tokens_proposed"] + st["pool_tokens_proposed"]:
        line += (f"; {plural(copied, 'token')} copied without the draft ({st['suffix_tokens_accepted']} from the "
                 f"request, {st['pool_tokens_accepted']} from earlier requests)")
    if st["drafted_ahead_used"]:
        line += f"; drafted ahead and used: {plural(st['drafted_ahead_used'], 'round')}"
    if result.stats.drafting_note:
        line += f"; {result.stats.drafting_note}"
    if st["grammar_tokens_proposed"]:
        line += (f"; {plural(st['grammar_tokens_accepted'], 'token')} forced by the grammar (proposed without the "
                 f"draft)")
    if st["prompt_tokens_reused"]:
        line += f"; {plural(st['prompt_tokens_reused'], 'prompt token')} reused from the cache"
    window = result.extra.get("draft_window")
    if window:  # the draft read a window of the text (see --draft-window)
        line += (f"; the draft read a window of {window['size']} tokens ({plural(window['slides'], 'slide')}, "
                 f"{plural(window['refed_tokens'], 'token')} read again)")
    return line
