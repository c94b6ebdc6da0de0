"""The runtime (bundle loading, vocabulary map, decoding, structured output, `edge-specdec info`) never imports the
export stack, nor Hugging Face's tokenizers; nor, `edge-specdec info` aside, the benchmark code."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "optimum", "nncf", "tokenizers")

PROBE = """
import json, sys
import edge_specdec, edge_specdec.runtime
from edge_specdec import load_bundle
bundle = load_bundle(sys.argv[1])
vmap = bundle.load_vocab_map()
assert vmap.intersection > 0
from edge_specdec.runtime import GenerationConfig, Pipeline
pipe = Pipeline(sys.argv[2])
result = pipe.generate("def f(x):", GenerationConfig(max_new_tokens=8), algorithm="standard")
assert result.stats.new_tokens >= 1 and result.stats.draft_tokens_proposed > 0
from edge_specdec.runtime.constraint import Constraint
schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
result = pipe.generate("x", GenerationConfig(max_new_tokens=12, constraint=Constraint.json_schema(schema)))
assert result.text.startswith('{"a": ') and "llguidance" in sys.modules  # structured output, without tokenizers
benchmark = sorted(m for m in sys.modules if m.startswith("edge_specdec.benchmark"))
assert not benchmark, f"the runtime imported the benchmark code: {benchmark}"
from edge_specdec.cli import main
main(["info", sys.argv[1]])
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
"""


@pytest.mark.slow
def test_runtime_never_imports_export_stack(bundle_dir):
    bundle = bundle_dir("qwen2-bytelevel", "llama-metaspace", "int8", "int8")
    same_vocab = bundle_dir("qwen2-bytelevel", "qwen2-bytelevel-small", "int8", "int8")
    proc = subprocess.run([sys.executable, "-c", PROBE, str(bundle), str(same_vocab)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    loaded = set(json.loads(lines[-1]))
    assert "openvino" not in HEAVY and "numpy" in loaded  # the probe really loaded the vocabulary map
    assert "heterogeneous" in proc.stdout
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))
