"""The `edge-specdec` command line."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence

from . import __version__
from .demo import DEMO_BUNDLE, DEMO_REPETITION_PENALTY, run_defaults
from .errors import EdgeSpecdecError

EXPORT_EXAMPLES = """\
examples:
  # a heterogeneous pair: any small model can draft for any target
  edge-specdec export --target Qwen/Qwen2.5-Coder-1.5B-Instruct \\
      --draft HuggingFaceTB/SmolLM2-135M-Instruct --out bundles/qwen-smol

  # local folders, int8 target, fp16 draft
  edge-specdec export --target ./qwen-1.5b --draft ./qwen-0.5b --out bundles/qwen \\
      --target-weights int8 --draft-weights fp16

  # a GGUF file as the source, int4 with a smaller group size and AWQ on calibration text
  edge-specdec export --target model.gguf --draft ./small --out bundles/b \\
      --target-group-size 64 --target-awq --target-dataset calib.txt

  # a pair from the catalog (edge-specdec pairs), written to bundles/NAME
  edge-specdec export --pair qwen-coder-1.5b+smollm2-135m

SRC is a local Hugging Face folder (config.json, weights, tokenizer.json), a hub id (ORG/NAME, needs the
hub to be reachable) or a .gguf file. The bundle is written atomically: an interrupted export leaves
nothing behind, and --force replaces an existing bundle only once the new one is complete.
"""


def _add_weight_options(parser: argparse.ArgumentParser, role: str, default: str) -> None:
    group = parser.add_argument_group(f"{role} weights")
    group.add_argument(f"--{role}-weights", metavar="FORMAT",
                       help=f"int4 | int8 | fp16 | fp32 (default {default})")
    group.add_argument(f"--{role}-group-size", type=int, metavar="N",
                       help="int4 group size (default 128; -1 = one scale per channel)")
    group.add_argument(f"--{role}-ratio", type=float, metavar="R",
                       help="share of layers in int4, the rest in int8 (default 1.0)")
    group.add_argument(f"--{role}-sym", action="store_true", help="symmetric quantization (default asymmetric)")
    group.add_argument(f"--{role}-awq", action="store_true", help="AWQ (data-aware with --%s-dataset)" % role)
    group.add_argument(f"--{role}-scale-estimation", action="store_true", help="scale estimation (needs a dataset)")
    group.add_argument(f"--{role}-dataset", metavar="FILE", help="calibration text, one sample per line")
    group.add_argument(f"--{role}-group-size-fallback", default="adjust", choices=("adjust", "ignore", "error"),
                       help="layers the group size does not divide: adjust (default), ignore or error")


def _weights(args: argparse.Namespace, role: str):
    from .export.convert import WeightSettings

    get = lambda name: getattr(args, f"{role}_{name}")  # noqa: E731
    return WeightSettings(format=get("weights"), group_size=get("group_size"), ratio=get("ratio"), sym=get("sym"),
                          awq=get("awq"), scale_estimation=get("scale_estimation"), dataset=get("dataset"),
                          group_size_fallback=get("group_size_fallback"))


DEFAULT_WEIGHTS = {"target": "int4", "draft": "int8"}


def _apply_pair(args: argparse.Namespace) -> None:
    """--pair NAME fills in what the command line leaves out; explicit options win."""
    pair = {}
    if args.pair:
        from .catalog import get_pair
        pair = get_pair(args.pair)
        args.target = args.target or pair["target"]
        args.draft = args.draft or pair["draft"]
        args.out = args.out or f"bundles/{args.pair}"
    for role in ("target", "draft"):
        if getattr(args, f"{role}_weights") is None:
            setattr(args, f"{role}_weights", pair.get(f"{role}_weights", DEFAULT_WEIGHTS[role]))
    if not args.target or not args.out:
        raise EdgeSpecdecError("export needs --target SRC and --out DIR, or --pair NAME (see `edge-specdec pairs`).")


def _cmd_pairs(args: argparse.Namespace) -> int:
    from .catalog import describe_pairs, load_catalog

    pairs = load_catalog()
    print(json.dumps(pairs, indent=2) if args.json else describe_pairs(pairs))
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    import shlex

    from .benchmark import run_benchmark
    from .benchmark.report import render_markdown

    spelled = ["edge-specdec", "bench", args.bundle, "--max-new-tokens", str(args.max_new_tokens), "--repeats",
               str(args.repeats), "--ks", *map(str, args.ks), "--precision", args.precision]
    for flag, value in (("--setups", args.setups), ("--categories", args.categories)):
        spelled += [flag, *value] if value else []
    spelled += ["--out", args.out] if args.out else []
    spelled += ["--kv-rollback", args.kv_rollback] if args.kv_rollback else []
    spelled += ["--draft-vocab", str(args.draft_vocab)] if args.draft_vocab is not None else []
    spelled += [flag for flag, on in (("--hf", args.hf), ("--no-genai", args.no_genai),
                                      ("--genai-ours", args.genai_ours), ("--concurrent", args.concurrent)) if on]
    command = shlex.join(spelled)
    if "bench" in sys.argv[1:]:  # called from a shell: keep what was typed too
        typed = shlex.join(["edge-specdec", *sys.argv[sys.argv.index("bench"):]])
        command = typed if typed == command else f"{typed}\n# the same with every option spelled out:\n{command}"
    report = run_benchmark(args.bundle, setups=args.setups, max_new_tokens=args.max_new_tokens,
                           repeats=args.repeats, ks=args.ks, categories=args.categories, out=args.out,
                           genai=not args.no_genai, genai_ours=args.genai_ours, concurrent=args.concurrent,
                           hf=args.hf, precision=args.precision, kv_rollback=args.kv_rollback,
                           draft_vocab=args.draft_vocab, command=command,
                           progress=_say)
    print(render_markdown(report))
    if report["not_identical"]:
        _say(f"edge-specdec: warning: output NOT identical to the same engine's target alone: "
             f"{', '.join(report['not_identical'])} (see report.md)")
    return 130 if report["settings"]["interrupted"] else 0


def _cmd_export(args: argparse.Namespace) -> int:
    from .export import export_bundle

    _apply_pair(args)

    progress = (lambda msg: print(msg, file=sys.stderr, flush=True)) if not args.quiet else None
    if args.check_only:  # every check export runs before converting, and no conversion; nothing is written
        from .export import check_export
        summary = check_export(args.target, args.draft, args.out, target_weights=_weights(args, "target"),
                               draft_weights=_weights(args, "draft"), force=args.force,
                               allow_larger_draft=args.allow_larger_draft, progress=progress)
        for role, info in summary.items():
            print(f"{role}: {info['source']['given']}: {info['model_type']} ({', '.join(info['architectures'])}), "
                  f"{info['num_parameters'] / 1e6:.1f}M parameters, tokenizer {info['tokenizer']}: ok")
        return 0
    export_bundle(args.target, args.draft, args.out, target_weights=_weights(args, "target"),
                  draft_weights=_weights(args, "draft"), force=args.force,
                  allow_larger_draft=args.allow_larger_draft, progress=progress)
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    from .bundle import describe, load_bundle

    bundle = load_bundle(args.bundle, verify=not args.no_verify,
                         progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    if args.json:
        print(json.dumps(bundle.manifest, indent=2, ensure_ascii=False))
    else:
        print(describe(bundle))
        print("checksums verified" if not args.no_verify else "checksums not verified (--no-verify)")
    return 0


DRAFT_VOCAB_HELP = ("the draft computes logits only for its first N token ids and its special tokens: a smaller "
                    "output layer, a faster draft step (default 65536; 0 = its whole vocabulary). The output "
                    "stays exact either way.")

RUN_EXAMPLES = """\
examples:
  edge-specdec run --prompt "def parse_args("        # no bundle: the demo pair that ships with edge-specdec
  edge-specdec run bundles/qwen --prompt "def quicksort(xs):" --max-new-tokens 64
  edge-specdec run bundles/qwen --prompt "def quicksort(xs):" --compare   # + the target alone: speedup, identical?
  edge-specdec run bundles/qwen --prompt-file prompt.txt --algorithm standard --num-assistant-tokens 3 \
      --confidence 0                      # exactly 3 drafted tokens per round (default: up to 8, until unsure)
  echo "Summarize: ..." | edge-specdec run bundles/qwen --prompt - --algorithm prompt-lookup
  edge-specdec run bundles/qwen --prompt "Once" --temperature 0.8 --top-p 0.9 --seed 7 --json
  edge-specdec run bundles/qwen+smollm --prompt "def f(x):" --algorithm tli --temperature 0.7 --top-k 20
  edge-specdec run bundles/qwen --chat                        # a conversation, with the model's chat template
  edge-specdec run bundles/qwen --chat --prompt "Explain Python decorators"   # one chat turn, scriptable
  edge-specdec run bundles/qwen --prompt "..." --draft-device GPU --target-device CPU --allow-fallback

algorithms:
  auto           the default: standard for a same-vocabulary draft; for a draft with another vocabulary
                 slem when greedy, tli when sampling (if most draft tokens exist in the target's
                 vocabulary, else slem); prompt-lookup when the bundle has no draft
  none           the target alone
  standard       draft model + verification (the draft shares the target's vocabulary)
  slem           any draft: its text is re-tokenized for the target, which keeps what it would have written
  tli            any draft: it drafts only tokens both vocabularies share; rejection sampling
  slrs           any draft: string-level rejection sampling of each round's first token; practical with a
                 small --top-k (it enumerates the draft's token tree), else it runs SLEM rounds
  prompt-lookup  n-gram matches from the prompt and the output, no draft model
Output is the target's own: identical to --algorithm none under greedy decoding, the same distribution
when sampling.
"""


def _read_prompt(args: argparse.Namespace) -> Optional[str]:
    if args.prompt_file:
        try:
            return open(args.prompt_file, encoding="utf-8").read()
        except OSError as exc:
            raise EdgeSpecdecError(f"cannot read --prompt-file {args.prompt_file}: {exc.strerror}.") from None
    if args.prompt == "-":
        return sys.stdin.read()
    if args.prompt is None and not args.chat:
        raise EdgeSpecdecError("no prompt: pass --prompt TEXT, --prompt - (read stdin), --prompt-file FILE, "
                               "or --chat for a conversation.")
    return args.prompt


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _stats_line(result) -> str:
    st = result.stats.as_dict()
    line = (f"[{result.extra['algorithm']}] {st['new_tokens']} tokens in {st['seconds']:.2f} s = "
            f"{st['tokens_per_s']:.1f} tokens/s; {st['target_passes']} target passes, "
            f"{st['mean_tokens_per_target_pass']:.2f} tokens per pass; acceptance {st['acceptance']:.2f} "
            f"({st['draft_tokens_accepted']}/{st['draft_tokens_proposed']}); time: draft {st['draft_seconds']:.2f} s, "
            f"target {st['target_seconds']:.2f} s, loop {st['loop_seconds']:.2f} s; stop: {result.stop_reason}")
    if result.extra.get("lookup_rounds"):
        line += f"; {result.extra['lookup_rounds']} rounds copied from the text by lookup"
    return line + (f"; drafted ahead and used: {st['drafted_ahead_used']} rounds" if st["drafted_ahead_used"] else "")


def _cmd_run(args: argparse.Namespace) -> int:
    from .runtime import GenerationConfig, Pipeline

    args.bundle, args.repetition_penalty = run_defaults(args.bundle, args.repetition_penalty)
    prompt = _read_prompt(args)
    if prompt is not None and not prompt.strip():
        raise EdgeSpecdecError("the prompt is empty: give some text to continue.")
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                              top_p=args.top_p, seed=args.seed, stop_strings=args.stop or [],
                              ignore_eos=args.ignore_eos, repetition_penalty=args.repetition_penalty,
                              logprobs=args.logprobs is not None, top_logprobs=args.logprobs or 0)
    config.validate()
    pipe = Pipeline(args.bundle, target_device=args.target_device, draft_device=args.draft_device,
                    precision=args.precision, kv_rollback=args.kv_rollback, allow_fallback=args.allow_fallback,
                    cache_dir=args.cache_dir, concurrent=args.concurrent, draft_vocab=args.draft_vocab,
                    threads=args.threads)
    if not args.json:
        _say(f"edge-specdec: {pipe.placement.describe()}" + ("; draft runs concurrently" if pipe.concurrent else ""))
    options = dict(algorithm=args.algorithm, num_assistant_tokens=args.num_assistant_tokens,
                   draft_policy="schedule" if args.adaptive else args.draft_policy, confidence=args.confidence,
                   lookup=not args.no_lookup)
    if args.chat and prompt is None:
        if args.compare:
            raise EdgeSpecdecError("--compare needs one prompt (--prompt, --prompt-file or stdin), not an "
                                   "interactive --chat session.")
        return _chat_loop(pipe, config, options)
    if args.chat:
        prompt = pipe.chat_prompt([{"role": "user", "content": prompt}])
    if args.compare:
        if pipe.resolve_algorithm(args.algorithm, config) == "none":
            raise EdgeSpecdecError("--compare measures speculative decoding against the target alone: choose an "
                                   "algorithm other than none.")
        # Untimed, at full length, as the benchmark warms up: the first calls of a process prepare kernels for
        # each new block shape and text length; a 16-token warm-up left them to the timed speculative run,
        # which then measured 0.64x where later runs measured 1.06x (the demo, `_read_config`).
        for algorithm in (args.algorithm, "none"):
            pipe.generate(prompt, config, **{**options, "algorithm": algorithm})
    stream = None if args.json else (lambda text: print(text, end="", flush=True))
    result = pipe.generate(prompt, config, on_text=stream, **options)
    baseline = pipe.generate(prompt, config, algorithm="none") if args.compare else None
    if not result.exact:
        _say("edge-specdec: warning: this run is exact only up to float noise (the target's session is not "
             "block-invariant: --kv-rollback masked, or a device that failed the check); a near-tie can give "
             "another token than the target alone. The default paged rollback on the CPU is bit-exact.")
    if args.json:
        pieces = pipe.vocab_map.target
        print(json.dumps({**result.to_dict(lambda t: (pieces.piece(t) or b"").decode("utf-8", "replace")),
                          "placement": vars(pipe.placement),
                          **({"compare": _comparison(result, baseline, config)} if baseline else {})},
                         ensure_ascii=False))
    else:
        print()
        if result.logprobs is not None:
            _say(_logprobs_lines(result, pipe.vocab_map.target))
        _say(_stats_line(result))
        if baseline:
            _say(_compare_line(_comparison(result, baseline, config), result.extra["algorithm"]))
    return 130 if result.stop_reason == "interrupted" else 0


def _logprobs_lines(result, pieces) -> str:
    """One line per output token: its text, its log-probability, and the best alternatives."""
    def shown(token: int) -> str:
        return repr((pieces.piece(token) or b"").decode("utf-8", "replace"))

    return "\n".join(f"{shown(lp.token)} {lp.logprob:.4f}" + "".join(f"  {shown(t)} {v:.4f}" for t, v in lp.top)
                     for lp in result.logprobs)


def _comparison(result, baseline, config) -> dict:
    """The speculative run against the target alone on the same prompt and settings."""
    speedup = result.stats.tokens_per_s / baseline.stats.tokens_per_s if baseline.stats.tokens_per_s else 0.0
    return {"target_alone_tokens_per_s": round(baseline.stats.tokens_per_s, 3), "speedup": round(speedup, 3),
            "identical": result.token_ids == baseline.token_ids if config.greedy else None}


def _compare_line(comparison: dict, algorithm: str) -> str:
    same = {True: "output identical to the target alone",
            False: "output DIFFERS from the target alone: a bug, please report it",
            None: "sampled: the same distribution as the target alone, not the same text"}[comparison["identical"]]
    return (f"compare: the target alone {comparison['target_alone_tokens_per_s']:.1f} tokens/s; {algorithm} "
            f"{comparison['speedup']:.2f}x that; {same}")


def _chat_loop(pipe, config, options) -> int:
    """An interactive conversation: each turn goes through the target's chat template."""
    pipe.chat_prompt([{"role": "user", "content": "hi"}])  # no template: say so before the first question
    _say("chat: type a message and press Enter; an empty line or Ctrl-D ends, Ctrl-C stops a reply.")
    messages: list[dict[str, str]] = []
    while True:
        try:
            print("> ", end="", file=sys.stderr, flush=True)
            line = sys.stdin.readline()
        except KeyboardInterrupt:
            line = ""
        if not line.strip():
            print(file=sys.stderr)
            return 0
        messages.append({"role": "user", "content": line.rstrip("\n")})
        result = pipe.generate(pipe.chat_prompt(messages), config,
                               on_text=lambda text: print(text, end="", flush=True), **options)
        print()
        _say(_stats_line(result))
        messages.append({"role": "assistant", "content": result.text})


def build_parser() -> argparse.ArgumentParser:
    from .runtime.pipeline import ALGORITHMS
    parser = argparse.ArgumentParser(
        prog="edge-specdec",
        description="Lossless speculative decoding on OpenVINO: a small draft model (of any vocabulary) proposes "
                    "tokens, the target verifies them, and the output is exactly the target's own.")
    parser.add_argument("--version", action="version", version=f"edge-specdec {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("export", help="convert and compress a (target, draft) pair into one bundle",
                       description="Convert a target and a draft model to OpenVINO IR, compress their weights with "
                                   "NNCF, convert their tokenizers and precompute the vocabulary map, into one "
                                   "bundle folder. Needs the export extra: pip install 'edge-specdec[export]'.",
                       epilog=EXPORT_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pair", metavar="NAME", help="a known pair from the catalog (`edge-specdec pairs`); "
                   "--target, --draft, --out and the weight options override its entries")
    p.add_argument("--target", metavar="SRC", help="the model whose output you want")
    p.add_argument("--draft", metavar="SRC", help="the small model that drafts (omit for a target-only bundle)")
    p.add_argument("--out", metavar="DIR", help="the bundle folder to write (with --pair: bundles/NAME)")
    p.add_argument("--force", action="store_true", help="replace an existing bundle at --out")
    p.add_argument("--allow-larger-draft", action="store_true", help="export even if the draft is the larger model")
    p.add_argument("--check-only", action="store_true",
                   help="run the checks export runs before converting (architectures against the installed "
                        "optimum-intel/transformers, tokenizers against openvino-tokenizers) and stop; writes nothing")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    _add_weight_options(p, "target", "int4")
    _add_weight_options(p, "draft", "int8")
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser("pairs", help="list known-good (target, draft) pairs for export --pair",
                       description="The catalog of known-good pairs (edge_specdec/data/pairs.json): sources, "
                                   "recommended weight formats and devices, and what we measured.",
                       epilog="example:\n  edge-specdec pairs\n  edge-specdec export --pair qwen-coder-1.5b+smollm2-135m",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print the catalog as JSON")
    p.set_defaults(func=_cmd_pairs)

    p = sub.add_parser("bench", help="benchmark a bundle: target alone, our algorithms and the peers, side by side",
                       description="Run the target alone, each of our algorithms that applies to the bundle (fixed "
                                   "and adaptive draft lengths), prompt lookup, OpenVINO GenAI's own pipelines and "
                                   "(--hf) transformers on the same prompts, interleaved in one run so that drift "
                                   "in machine speed hits all alike. Prints a report and writes report.json, "
                                   "report.md and speedup.png (needs matplotlib: pip install 'edge-specdec[bench]') "
                                   "to --out. Progress goes to stderr, the Markdown report to stdout.",
                       epilog="""\
examples:
  edge-specdec bench bundles/qwen                                  # the default rows, all 7 prompt categories
  edge-specdec bench bundles/qwen --categories code_generation math --max-new-tokens 32 --repeats 1
  edge-specdec bench bundles/qwen --setups ours-none 'ours-standard-*' genai-sd-k3 --ks 2 3 4
  edge-specdec bench bundles/qwen+smollm --hf --out results/smollm   # + transformers UAG
  edge-specdec bench bundles/qwen --genai-ours --concurrent --precision f32

setups (--setups takes names or shell patterns; the target alone of each engine is always added):
  ours-none                  our Pipeline, the target alone
  ours-ALG-kK                our speculative decoding, K fixed (each of --ks); ALG = standard (same
                             vocabulary), slem and tli (other vocabulary), prompt-lookup
  ours-ALG-schedule, ours-ALG-cost   the same with an adaptive draft length (--draft-policy of `run`)
  ours-ALG-conf              the runtime's default: up to 8 tokens, stopping under draft probability 0.7
  ours-concurrent-ALG-...    drafting during verification, from a Pipeline(concurrent=True)  (--concurrent)
  genai-none, genai-sd-kK    OpenVINO GenAI alone / speculative, its default CPU properties  (same vocabulary)
  genai-sd-conf              GenAI speculative with its assistant_confidence_threshold 0.7
  genai-ours-none, genai-ours-sd-kK   the same with our CPU properties (--precision)        (--genai-ours)
  hf-none, hf-assisted, hf-uag        transformers fp32 on the bundle's source folders            (--hf)

prompt categories: code_generation, code_editing, chat, summarization, question_answering, math, translation
(edge_specdec/benchmark/prompts.json), in the target's chat template when it has one. Every row is greedy and
is checked against the target alone of its engine: the output must be identical.
""", formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundle", metavar="BUNDLE", help="a bundle folder written by `edge-specdec export`")
    p.add_argument("--setups", nargs="+", metavar="NAME", help="rows to run: names or patterns such as 'ours-*' "
                   "(default: every row the bundle allows but the optional ones; --hf, --genai-ours and "
                   "--concurrent add theirs either way)")
    p.add_argument("--max-new-tokens", type=int, default=64, metavar="N", help="tokens per run (default 64)")
    p.add_argument("--repeats", type=int, default=2, metavar="N",
                   help="timed runs per prompt and row, after one warm-up (default 2)")
    p.add_argument("--ks", type=int, nargs="+", default=[3, 5], metavar="K",
                   help="fixed draft lengths (default 3 5); the adaptive rows start at the smallest")
    p.add_argument("--categories", nargs="+", metavar="CAT", help="prompt categories (default: all)")
    p.add_argument("--out", metavar="DIR", help="where to write the report (default bench-results/<bundle name>)")
    p.add_argument("--hf", action="store_true",
                   help="add transformers rows (fp32, CPU) from the source folders in the bundle's manifest")
    p.add_argument("--no-genai", action="store_true", help="leave out the OpenVINO GenAI rows")
    p.add_argument("--genai-ours", action="store_true",
                   help="add GenAI rows with our CPU properties (--precision): the loop-against-loop comparison")
    p.add_argument("--concurrent", action="store_true",
                   help="add rows that draft while the target verifies (a second Pipeline, concurrent=True)")
    p.add_argument("--precision", default="dq", choices=("dq", "f32"), help="our CPU precision (default dq)")
    p.add_argument("--kv-rollback", choices=("paged", "masked"), help="our KV rollback (default: per device)")
    p.add_argument("--draft-vocab", type=int, metavar="N", help=DRAFT_VOCAB_HELP)
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser("info", help="validate a bundle and show what is inside",
                       description="Validate a bundle (files present, sizes and sha256 checksums) and print a summary.",
                       epilog="example:\n  edge-specdec info bundles/qwen-smol\n  edge-specdec info bundles/qwen-smol "
                              "--json | jq .vocabulary", formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundle", metavar="BUNDLE", help="a bundle folder written by `edge-specdec export`")
    p.add_argument("--json", action="store_true", help="print the whole manifest as JSON")
    p.add_argument("--no-verify", action="store_true", help="skip the sha256 checks (sizes are still checked)")
    p.set_defaults(func=_cmd_info)

    p = sub.add_parser("run", help="generate text from a bundle, with speculative decoding",
                       description="Generate with the bundle's target, drafting with its draft model or prompt "
                                   "lookup. Text streams to stdout, statistics go to stderr.",
                       epilog=RUN_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundle", metavar="BUNDLE", nargs="?",
                   help="a bundle folder written by `edge-specdec export` (optional; default: the demo pair that "
                        f"ships with edge-specdec, {DEMO_BUNDLE}, a 6.8M-parameter Python code model)")
    p.add_argument("--prompt", metavar="TEXT", help="the prompt; - reads it from stdin")
    p.add_argument("--prompt-file", metavar="FILE", help="read the prompt from a file")
    p.add_argument("--max-new-tokens", type=int, default=128, metavar="N", help="tokens to generate (default 128)")
    p.add_argument("--algorithm", default="auto", choices=ALGORITHMS, help="see below (default auto)")
    p.add_argument("--num-assistant-tokens", type=int, metavar="K",
                   help="the most tokens drafted per round (the first K of the adaptive policies; default 8 with "
                        "a draft model, 3 for prompt lookup)")
    p.add_argument("--confidence", type=float, metavar="P",
                   help="a draft model stops drafting after a token whose top probability is under P (default "
                        "0.7, measured best on our real pairs; 0 drafts K tokens every round)")
    p.add_argument("--draft-policy", default="fixed", choices=("fixed", "schedule", "cost"),
                   help="how K changes: fixed (the default); schedule: +2 after a fully accepted round, -1 "
                        "otherwise; cost: the K that maximizes tokens/s from the acceptance and the draft and "
                        "target costs measured during the run (K=0, the target alone, when drafting does not pay)")
    p.add_argument("--adaptive", action="store_true", help="the same as --draft-policy schedule")
    p.add_argument("--no-lookup", action="store_true",
                   help="let the draft model draft every round (by default a round first looks for the next "
                        "tokens in the prompt and the output, and proposes them without running the draft "
                        "when found: text that repeats, such as code being edited, goes faster)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0, help="sample from the K most likely tokens (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1.0 = off)")
    p.add_argument("--seed", type=int, help="random seed for sampling")
    p.add_argument("--repetition-penalty", type=float, metavar="R",
                   help="divide the logits of tokens already in the text by R (Hugging Face semantics; 1.0 = off, "
                        f"the default; the demo pair's default is {DEMO_REPETITION_PENALTY}, which keeps its tiny "
                        "target from repeating itself)")
    p.add_argument("--stop", action="append", metavar="TEXT", help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-sequence token")
    p.add_argument("--chat", action="store_true",
                   help="apply the target's chat template; without a prompt, an interactive conversation")
    p.add_argument("--target-device", default="AUTO", metavar="DEV",
                   help="CPU, GPU, GPU.N, NPU or AUTO (default: a discrete GPU if any, else the CPU)")
    p.add_argument("--draft-device", default="AUTO", metavar="DEV",
                   help="CPU, GPU, GPU.N, NPU or AUTO (default: an integrated GPU or the NPU if any, else the CPU)")
    p.add_argument("--allow-fallback", action="store_true",
                   help="if a device asked for is absent, run on the CPU instead of failing")
    p.add_argument("--concurrent", action=argparse.BooleanOptionalAction, default=None,
                   help="draft the next round while the target verifies (default: on when draft and target sit "
                        "on different devices; on one CPU each model then gets half of the cores)")
    p.add_argument("--cache-dir", metavar="DIR",
                   help="OpenVINO compiled-model cache (default ~/.cache/edge-specdec/ov-cache or "
                        "$EDGE_SPECDEC_CACHE_DIR; 'off' disables it)")
    p.add_argument("--threads", type=int, metavar="N",
                   help="CPU threads per model (default: 1 for a model under 32 MB, whose narrow layers lose more "
                        "to thread barriers than they gain; else all cores, or half each with --concurrent)")
    p.add_argument("--precision", default="dq", choices=("dq", "f32"),
                   help="CPU arithmetic: dq = dynamic int8 activations, in groups as large as the int4 weights' "
                        "groups (default, about 1.5x faster here), f32 = plain float32, closest to the original "
                        "model. The speculative output equals the target alone's under the same setting either way.")
    p.add_argument("--kv-rollback", choices=("paged", "masked"),
                   help="how the KV cache forgets rejected tokens: paged (default on CPU/GPU: paged-attention "
                        "IR, bit-exact) or masked (stateful IR with attention-mask rollback, always f32)")
    p.add_argument("--draft-vocab", type=int, metavar="N", help=DRAFT_VOCAB_HELP)
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
    p.set_defaults(func=_cmd_run)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except EdgeSpecdecError as exc:
        print(f"edge-specdec: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nedge-specdec: interrupted; nothing was left half-written.", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
