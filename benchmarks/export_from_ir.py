"""A bundle built from OpenVINO IR folders, in a process that cannot import torch, against the bundle they came from.

    python benchmarks/export_from_ir.py BUNDLE [--out DIR] [--tokens 48]

BUNDLE's target/ and draft/ folders are stateful IR folders as optimum-intel writes them (weights compressed, the
tokenizers converted, config.json and tokenizer.json beside them): this exports them again as IR sources
(`edge-specdec export --target DIR --draft DIR`) in a child process where torch, transformers, optimum, nncf,
tokenizers and huggingface_hub are made unimportable, and prints its wall time and peak RSS. Then both bundles
generate greedily on a few prompts (the default algorithm and the target alone) and the token ids are compared.
"""
from __future__ import annotations

import argparse
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEAVY = ("torch", "transformers", "optimum", "nncf", "tokenizers", "huggingface_hub", "gguf", "accelerate")
EXPORT = f"""
import sys
for name in {HEAVY!r}:
    sys.modules[name] = None  # any import of these fails
from edge_specdec.cli import main
sys.exit(main(["export", "--target", sys.argv[1], "--draft", sys.argv[2], "--out", sys.argv[3]]))
"""
PROMPTS = ["def parse_args(argv):\n", "class LRUCache:\n    def __init__(self, capacity):",
           "import json\n\n\ndef load_config(path):", "# Merge two sorted lists into one sorted list\ndef merge("]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--out", type=Path, help="where to write the new bundle (default: a temporary folder)")
    parser.add_argument("--tokens", type=int, default=48)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="ir-export-"))
    out = args.out or scratch / "bundle"
    try:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", EXPORT, str(args.bundle / "target"), str(args.bundle / "draft"),
                        str(out)], check=True)
        seconds = time.perf_counter() - start
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
        print(f"export from IR folders, torch unimportable: {seconds:.1f} s, peak RSS {peak:.2f} GiB", flush=True)

        from edge_specdec.runtime import GenerationConfig, Pipeline

        config = GenerationConfig(max_new_tokens=args.tokens)
        pipes = {"original": Pipeline(args.bundle, static_shapes=False), "from IR": Pipeline(out, static_shapes=False)}
        same = 0
        for prompt in PROMPTS:
            for algorithm in ("none", "auto"):
                ids = {name: pipe.generate(prompt, config, algorithm=algorithm).token_ids
                       for name, pipe in pipes.items()}
                equal = ids["original"] == ids["from IR"]
                same += equal
                print(f"{algorithm:>4} {prompt[:30]!r}: {len(ids['original'])} tokens, equal {equal}", flush=True)
        print(f"token ids equal in {same} of {2 * len(PROMPTS)} runs")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
