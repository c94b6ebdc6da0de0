"""`edge-specdec export`: a (target, draft) pair converted and compressed into one bundle."""
from __future__ import annotations

import argparse
import json
import sys

from ..errors import EdgeSpecdecError

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

  # the draft for an NPU (symmetric int8) or an iGPU (int4, groups of 128)
  edge-specdec export --target ./qwen-1.5b --draft ./smollm2 --out bundles/npu --draft-preset npu

  # a pair from the catalog (edge-specdec pairs), written to bundles/NAME
  edge-specdec export --pair qwen-coder-1.5b+smollm2-135m

  # OpenVINO IR folders (optimum-cli's output, OpenVINO's published models): weights kept as they are, no torch
  edge-specdec export --target ./qwen-1.5b-int4-ov --draft ./smollm2-int8-ov --out bundles/ir

  # hub ids of OpenVINO IR repositories: pip install 'edge-specdec[hub]' is all they need
  edge-specdec export --target OpenVINO/Qwen2.5-1.5B-Instruct-int4-ov \
      --draft OpenVINO/Qwen2.5-0.5B-Instruct-int8-ov --out bundles/ir-hub

SRC is a local Hugging Face folder (config.json, weights, tokenizer.json), an OpenVINO IR folder
(openvino_model.xml/.bin of a stateful LLM, tokenizer.json), a hub id of either (ORG/NAME, needs the hub
to be reachable or its cache, and huggingface_hub: pip install 'edge-specdec[hub]') or a .gguf file.
The bundle is written atomically: an interrupted export leaves nothing behind, and --force replaces an
existing bundle only once the new one is complete.
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


DEFAULT_FORMATS = {"target": "int4", "draft": "int8"}  # as export_bundle's defaults, when other options are given


def _weights(args: argparse.Namespace, role: str):
    """The role's weight settings, or None when neither the command line nor the pair gives any: the export then
    takes its default (int4 target, int8 draft) for a model it converts, and an IR source keeps its own weights."""
    from ..export.convert import WeightSettings

    get = lambda name: getattr(args, f"{role}_{name}")  # noqa: E731
    if get("weights") is None and not any(get(name) not in (None, False) for name in (
            "group_size", "ratio", "sym", "awq", "scale_estimation", "dataset")) \
            and get("group_size_fallback") == "adjust" and not (role == "draft" and args.draft_preset):
        return None
    return WeightSettings(format=get("weights") or DEFAULT_FORMATS[role], group_size=get("group_size"),
                          ratio=get("ratio"), sym=get("sym"), awq=get("awq"),
                          scale_estimation=get("scale_estimation"), dataset=get("dataset"),
                          group_size_fallback=get("group_size_fallback"),
                          preset=args.draft_preset if role == "draft" else None)


def _apply_preset(args: argparse.Namespace) -> None:
    """--draft-preset fills in the draft weight options the command line leaves out."""
    from ..export.convert import DRAFT_PRESETS

    for name, value in DRAFT_PRESETS.get(args.draft_preset, {}).items():
        if getattr(args, f"draft_{name}") in (None, False):
            setattr(args, f"draft_{name}", value)


def _apply_pair(args: argparse.Namespace) -> None:
    """--pair NAME fills in what the command line leaves out; explicit options win. A weight format that neither
    gives stays None: the export's default (int4 target, int8 draft), or an IR source's own weights."""
    pair = {}
    if args.pair:
        from ..catalog import get_pair
        pair = get_pair(args.pair)
        args.target = args.target or pair["target"]
        args.draft = args.draft or pair["draft"]
        args.out = args.out or f"bundles/{args.pair}"
    for role in ("target", "draft"):
        if getattr(args, f"{role}_weights") is None:
            setattr(args, f"{role}_weights", pair.get(f"{role}_weights"))
    if not args.target or not args.out:
        raise EdgeSpecdecError("export needs --target SRC and --out DIR, or --pair NAME (see `edge-specdec pairs`).")


def _generation_defaults(args: argparse.Namespace) -> dict:
    """--generation-default NAME=VALUE options as a dict, each VALUE read as JSON (1.2, true, 40) or else as text,
    checked as GenerationConfig checks it."""
    from ..export import check_generation_defaults

    defaults = {}
    for item in args.generation_default or []:
        name, sep, text = item.partition("=")
        if not sep or not name.strip():
            raise EdgeSpecdecError(f"--generation-default {item!r}: write NAME=VALUE, e.g. repetition_penalty=1.2.")
        try:
            defaults[name.strip()] = json.loads(text)
        except ValueError:
            defaults[name.strip()] = text
    return check_generation_defaults(defaults)


def _cmd_export(args: argparse.Namespace) -> int:
    from ..export import export_bundle

    _apply_preset(args)
    _apply_pair(args)
    _generation_defaults(args)  # refused before any work

    progress = (lambda msg: print(msg, file=sys.stderr, flush=True)) if not args.quiet else None
    if args.check_only:  # every check export runs before converting, and no conversion; nothing is written
        from ..export import check_export
        summary = check_export(args.target, args.draft, args.out, target_weights=_weights(args, "target"),
                               draft_weights=_weights(args, "draft"), force=args.force,
                               allow_larger_draft=args.allow_larger_draft, progress=progress)
        for role, info in summary.items():
            kept = " kept as they are (an OpenVINO IR)" if info["source_kind"] == "openvino-ir" else ""
            print(f"{role}: {info['source']['given']}: {info['model_type']} ({', '.join(info['architectures'])}), "
                  f"{info['num_parameters'] / 1e6:.1f}M parameters, weights {info['weights']}{kept}, "
                  f"tokenizer {info['tokenizer']}: ok")
        return 0
    export_bundle(args.target, args.draft, args.out, target_weights=_weights(args, "target"),
                  draft_weights=_weights(args, "draft"), force=args.force,
                  allow_larger_draft=args.allow_larger_draft, generation_defaults=_generation_defaults(args),
                  progress=progress)
    return 0


def add_parser(sub) -> None:
    """The `export` subcommand."""
    p = sub.add_parser("export", help="convert and compress a (target, draft) pair into one bundle",
                       description="Convert a target and a draft model to OpenVINO IR, compress their weights with "
                                   "NNCF, convert their tokenizers and precompute the vocabulary map, into one "
                                   "bundle folder. Needs the export extra: pip install 'edge-specdec[export]'. "
                                   "Models the runtime cannot decode exactly (recurrent or hybrid layers, LongRoPE "
                                   "past its switch, attention-logit softcapping) are refused first, in one line "
                                   "(`edge-specdec docs export`: the architectures the runtime decodes).",
                       epilog=EXPORT_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pair", metavar="NAME", help="a known pair from the catalog (`edge-specdec pairs`); "
                   "--target, --draft, --out and the weight options override its entries")
    p.add_argument("--target", metavar="SRC", help="the model whose output you want: a Hugging Face folder, an "
                   "OpenVINO IR folder, a hub id of either, or a .gguf file")
    p.add_argument("--draft", metavar="SRC", help="the small model that drafts (omit for a target-only bundle)")
    p.add_argument("--out", metavar="DIR", help="the bundle folder to write (with --pair: bundles/NAME)")
    p.add_argument("--force", action="store_true", help="replace an existing bundle at --out")
    p.add_argument("--allow-larger-draft", action="store_true", help="export even if the draft is the larger model")
    p.add_argument("--check-only", action="store_true",
                   help="run the checks export runs before converting (architectures against the runtime and the "
                        "installed optimum-intel/transformers, tokenizers against openvino-tokenizers) and stop; "
                        "writes nothing")
    p.add_argument("--generation-default", action="append", metavar="NAME=VALUE",
                   help="record a GenerationConfig default in the bundle (repeatable), which requests that leave the "
                        "setting out then get: e.g. repetition_penalty=1.2; `edge-specdec info` shows them. Nothing "
                        "is taken from the model's generation_config.json")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    _add_weight_options(p, "target", "int4")
    _add_weight_options(p, "draft", "int8")
    p.add_argument("--draft-preset", choices=("npu", "gpu"),
                   help="the draft's weights for the device it will run on: npu = symmetric int8 (the NPU compiler "
                        "wants symmetric weights), gpu = int4 in groups of 128; --draft-* options given win")
    p.set_defaults(func=_cmd_export)
