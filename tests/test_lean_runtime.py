"""The runtime side (bundle loading, vocabulary map, `edge-specdec info`) never imports the export stack."""
from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "transformers", "optimum", "nncf")

PROBE = """
import json, sys
import edge_specdec, edge_specdec.runtime
from edge_specdec import load_bundle
from edge_specdec.cli import main
bundle = load_bundle(sys.argv[1])
vmap = bundle.load_vocab_map()
assert vmap.intersection > 0
main(["info", sys.argv[1]])
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
"""


def test_runtime_never_imports_export_stack(bundle_dir):
    bundle = bundle_dir("qwen2-bytelevel", "llama-metaspace", "int8", "int8")
    proc = subprocess.run([sys.executable, "-c", PROBE, str(bundle)], capture_output=True, text=True, check=True)
    lines = proc.stdout.strip().splitlines()
    loaded = set(json.loads(lines[-1]))
    assert "openvino" not in HEAVY and "numpy" in loaded  # the probe really loaded the vocabulary map
    assert "heterogeneous" in proc.stdout
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))
