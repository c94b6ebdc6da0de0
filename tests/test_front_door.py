"""The API's front door: the names a user needs at the top level, and no bundle meaning the packaged demo."""
from __future__ import annotations

import subprocess
import sys

import edge_specdec
from edge_specdec.demo import DEMO_BUNDLE


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


def test_no_bundle_opens_the_demo_with_the_defaults_its_manifest_records():
    from edge_specdec import GenerationConfig, Pipeline

    pipe = Pipeline(static_shapes=False)
    assert pipe.bundle.path.resolve() == DEMO_BUNDLE
    assert pipe.default_config.repetition_penalty == 1.2 == pipe.bundle.generation_defaults["repetition_penalty"]
    off = pipe.generate("def parse_args(", GenerationConfig(max_new_tokens=48, repetition_penalty=1.0))
    default = pipe.generate("def parse_args(")
    partial = pipe.generate("def parse_args(", GenerationConfig(max_new_tokens=48))
    assert partial.token_ids == default.token_ids[:len(partial.token_ids)]
    assert len(set(off.text.split())) < len(set(partial.text.split()))  # the penalty is what stops the loop


def test_a_partial_config_through_the_api_writes_what_run_writes(capsys):
    """The README's snippet: GenerationConfig(max_new_tokens=64) keeps the demo's recorded defaults, as `run` does."""
    import json

    from edge_specdec import GenerationConfig, Pipeline
    from edge_specdec.cli import main

    capsys.readouterr()
    assert main(["run", "--prompt", "def fib(n):", "--max-new-tokens", "64", "--json"]) == 0
    ran = json.loads(capsys.readouterr().out)
    pipe = Pipeline(static_shapes=False)
    api = pipe.generate("def fib(n):", GenerationConfig(max_new_tokens=64))
    assert api.token_ids == ran["token_ids"] and api.text == ran["text"]
    # a value set equal to GenerationConfig's own default still wins over the bundle's: 1.0 means off, in both
    assert main(["run", "--prompt", "def fib(n):", "--max-new-tokens", "64", "--repetition-penalty", "1",
                 "--json"]) == 0
    off = pipe.generate("def fib(n):", GenerationConfig(max_new_tokens=64, repetition_penalty=1.0))
    assert off.token_ids == json.loads(capsys.readouterr().out)["token_ids"] != api.token_ids


def test_generation_fields_are_keyword_arguments_of_generate_as_in_genai():
    """OpenVINO GenAI's `generate(prompt, max_new_tokens=64)`: GenerationConfig's fields as keywords, beside
    SpeculativeConfig's, the bundle's defaults kept for the rest; a chat turn's fit to the context counts them."""
    import pytest

    from edge_specdec import GenerationConfig, Pipeline
    from edge_specdec.errors import EdgeSpecdecError
    from edge_specdec.runtime.session import ContextOverflowError

    pipe = Pipeline(static_shapes=False)
    given = pipe.generate("def fib(n):", GenerationConfig(max_new_tokens=24, seed=3), algorithm="none")
    keywords = pipe.generate("def fib(n):", max_new_tokens=24, seed=3, algorithm="none")
    assert keywords.token_ids == given.token_ids and len(keywords.token_ids) == 24
    off = pipe.generate("def fib(n):", max_new_tokens=24, repetition_penalty=1.0, algorithm="none")
    assert off.token_ids != given.token_ids  # the demo's recorded penalty applies unless a keyword sets it
    assert len(pipe.generate("def fib(n):", max_new_tokens=4, logprobs=True).logprobs) == 4  # the README's
    # beside a config, keywords override its fields (as GenAI's update_config_from_kwargs does); its unset fields
    # still take the bundle's
    over = pipe.generate("def fib(n):", GenerationConfig(max_new_tokens=8, seed=3), max_new_tokens=24,
                         algorithm="none")
    assert over.token_ids == given.token_ids
    # another tool's name for an argument, or a misspelt one: what was meant
    with pytest.raises(TypeError, match="unknown generate.. argument 'max_tokens': did you mean max_new_tokens"):
        pipe.generate("def fib(n):", max_tokens=8)
    with pytest.raises(TypeError, match="'streamer': did you mean on_text"):
        pipe.generate("def fib(n):", streamer=print)
    with pytest.raises(TypeError, match="'on_prefil': did you mean on_prefill"):
        pipe.stream("def fib(n):", on_prefil=print)  # where stream() is called, not at its first piece
    # a keyword of the wrong type: one line that names it, before anything runs
    for keywords, named in (({"max_new_tokens": "12"}, "max_new_tokens"), ({"seed": "1"}, "seed"),
                            ({"stop_strings": "\n\n"}, r"stop_strings=\[text\]"),
                            ({"eos_token_ids": 0}, "eos_token_ids"), ({"logprobs": 5}, "top_logprobs=N")):
        with pytest.raises(EdgeSpecdecError, match=named):
            pipe.generate("def fib(n):", **keywords)
        with pytest.raises(EdgeSpecdecError, match=named):
            pipe.start_chat().ask("def fib(n):", **keywords)
    chat = pipe.start_chat()
    room = pipe.target_model.max_context - len(pipe.chat_prompt([{"role": "user", "content": "def fib(n):"}]))
    with pytest.raises(ContextOverflowError, match="1 tokens over|1 token over"):
        chat.ask("def fib(n):", max_new_tokens=room + 1)
    assert chat.messages == [] and chat.ask("def fib(n):", max_new_tokens=4).stats.new_tokens == 4


def test_every_generation_field_records_whether_it_was_set():
    """Generic: any field of GenerationConfig, those added later too, is tracked without a list to maintain."""
    import dataclasses

    from edge_specdec import GenerationConfig

    bundle = GenerationConfig(max_new_tokens=7, temperature=0.5, top_k=3, repetition_penalty=1.2).pinned()
    for f in dataclasses.fields(GenerationConfig):
        given = GenerationConfig(**{f.name: getattr(GenerationConfig(), f.name)})  # set, to the class default
        assert given.fields_set == {f.name}
        resolved = given.with_defaults(bundle)
        assert getattr(resolved, f.name) == getattr(GenerationConfig(), f.name)  # the value set wins
        assert all(getattr(resolved, g.name) == getattr(bundle, g.name) for g in dataclasses.fields(GenerationConfig)
                   if g.name != f.name)  # the rest take the bundle's
    late = GenerationConfig()
    late.repetition_penalty = 1.0  # assigned after construction: set too
    assert late.with_defaults(bundle).repetition_penalty == 1.0 and late.with_defaults(bundle).top_k == 3
    assert GenerationConfig(9).fields_set == {"max_new_tokens"}  # by position


def test_a_manifest_default_that_is_no_setting_is_one_clear_error(tmp_path):
    import json
    import shutil

    import pytest

    from edge_specdec import Pipeline
    from edge_specdec.errors import BundleError

    bundle = tmp_path / "demo"
    shutil.copytree(DEMO_BUNDLE, bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    for defaults, words in (({"repetiton_penalty": 1.2}, "'repetiton_penalty' that is no GenerationConfig field"),
                            ({"repetition_penalty": 0}, "repetition_penalty must be between")):
        (bundle / "manifest.json").write_text(json.dumps({**manifest, "generation_defaults": defaults}))
        with pytest.raises(BundleError, match=words):
            Pipeline(bundle, static_shapes=False, warm_up=False)
