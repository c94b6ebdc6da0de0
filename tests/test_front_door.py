"""The API's front door: the names a user needs at the top level, and no bundle meaning the packaged demo."""
from __future__ import annotations

import subprocess
import sys

import edge_specdec
from edge_specdec.demo import DEMO_BUNDLE, DEMO_REPETITION_PENALTY


def test_the_top_level_exports_what_a_user_needs():
    from edge_specdec import Conversation, Engine, GenerationConfig, Pipeline, Result
    from edge_specdec import runtime

    assert (Pipeline, Engine, GenerationConfig, Result, Conversation) == (
        runtime.Pipeline, runtime.Engine, runtime.GenerationConfig, runtime.Result, runtime.Conversation)
    assert {"Pipeline", "Engine", "GenerationConfig", "Result"} <= set(edge_specdec.__all__)


def test_importing_the_package_loads_no_runtime():
    """The CLI and the export stage import edge_specdec first: the runtime (OpenVINO) loads only when used."""
    code = "import sys, edge_specdec; print('edge_specdec.runtime' in sys.modules, 'openvino' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


def test_no_bundle_opens_the_demo_with_its_run_defaults():
    from edge_specdec import GenerationConfig, Pipeline

    pipe = Pipeline(static_shapes=False)
    assert pipe.bundle.path.resolve() == DEMO_BUNDLE
    assert pipe.default_config.repetition_penalty == DEMO_REPETITION_PENALTY
    plain = pipe.generate("def parse_args(", GenerationConfig(max_new_tokens=48))
    default = pipe.generate("def parse_args(")
    penalized = pipe.generate("def parse_args(", GenerationConfig(repetition_penalty=DEMO_REPETITION_PENALTY))
    assert default.token_ids == penalized.token_ids[:len(default.token_ids)]
    assert len(set(plain.text.split())) < len(set(default.text.split()))  # the penalty is what stops the loop
