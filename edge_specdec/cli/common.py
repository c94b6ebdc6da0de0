"""What the subcommands share: messages on stderr, help texts and the engine options used by more than one."""
from __future__ import annotations

import argparse
import sys

from ..runtime.devices import NPU_MAX_PROMPT, PRECISIONS


def say(message: str) -> None:
    """A message for the person at the terminal (stderr), so that stdout holds only the output."""
    print(message, file=sys.stderr, flush=True)


DRAFT_VOCAB_HELP = ("the draft computes logits only for its first N token ids and its special tokens: a smaller "
                    "output layer, a faster draft step (default 65536; 0 = its whole vocabulary). The output "
                    "stays exact either way.")


def add_engine_options(p: argparse.ArgumentParser) -> None:
    """Where and how the engine runs, as run, serve and check take it: the devices, the compiled-model cache,
    CPU threads and arithmetic, the draft's vocabulary cut (see engine_options)."""
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
                   help="CPU threads per model (default: 1 for a model under 32 MB, whose narrow layers lose more "
                        "to thread barriers than they gain; else all cores, or half each with --concurrent)")
    p.add_argument("--precision", default="dq", choices=PRECISIONS,
                   help="CPU arithmetic: dq = dynamic int8 activations, in groups as large as the int4 weights' "
                        "groups (default, about 1.5x faster here), f32 = plain float32, closest to the original "
                        "model. The speculative output equals the target alone's under the same setting either way.")
    p.add_argument("--draft-vocab", type=int, metavar="N", help=DRAFT_VOCAB_HELP)
    p.add_argument("--npu-max-prompt", type=int, default=NPU_MAX_PROMPT, metavar="N",
                   help=f"the longest prompt, in tokens, a model on the NPU is compiled for (default "
                        f"{NPU_MAX_PROMPT}; the NPU compiles static shapes, and a longer prompt is refused)")


def engine_options(args: argparse.Namespace) -> dict:
    """The Engine keyword arguments of the options add_engine_options added."""
    return dict(target_device=args.target_device, draft_device=args.draft_device, allow_fallback=args.allow_fallback,
                cache_dir=args.cache_dir, threads=args.threads, precision=args.precision, draft_vocab=args.draft_vocab,
                npu_max_prompt=args.npu_max_prompt)
