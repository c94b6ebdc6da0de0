"""A chat template given as a file (`--chat-template FILE`, `chat_template=`): what the model sees changes, the bundle
does not; `info` on what a template can hold; `info --rehash` records a deliberate edit of a bundle's files."""
from __future__ import annotations

import json
import shutil

import pytest

from edge_specdec.bundle import load_bundle
from edge_specdec.cli import main
from edge_specdec.errors import BundleError, EdgeSpecdecError
from edge_specdec.runtime import Engine, GenerationConfig, Pipeline
from support import SAME_VOCAB, run_cli, tree_state

BRACKETS = "{% for m in messages %}[{{ m.role }}: {{ m.content }}]\n{% endfor %}[assistant: "
REFUSES_SYSTEM = ("{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system role') }}"
                  "{% endif %}{{ m.content }}\n{% endfor %}")
ASK = [{"role": "user", "content": "sort a list"}]


@pytest.fixture(scope="module")
def template_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("templates") / "brackets.jinja"
    path.write_text(BRACKETS)
    return path


def test_a_template_file_changes_what_the_model_sees_and_the_bundle_still_verifies(bundle_dir, template_file):
    bundle = bundle_dir(*SAME_VOCAB)
    before = tree_state(bundle)
    engine = Engine(bundle, chat_template=template_file, verify_checksums=True, static_shapes=False)
    assert engine.chat_prompt(ASK) == engine.tokenizer.encode("[user: sort a list]\n[assistant: ")
    assert Engine(bundle, static_shapes=False).chat_template is None  # the bundle's own target has none
    as_text = engine.session().generate("[user: sort a list]\n[assistant: ", GenerationConfig(max_new_tokens=8))
    as_chat = engine.session().generate(engine.chat_prompt(ASK), GenerationConfig(max_new_tokens=8))
    assert as_chat.token_ids == as_text.token_ids
    assert tree_state(bundle) == before
    load_bundle(bundle, verify=True)


def test_a_template_file_that_cannot_be_used_is_refused_at_load(bundle_dir, tmp_path):
    with pytest.raises(EdgeSpecdecError, match=r"cannot read the chat template .*nope\.jinja.*pass the path"):
        Pipeline(bundle_dir(*SAME_VOCAB), chat_template=tmp_path / "nope.jinja", static_shapes=False)
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m.content }")
    with pytest.raises(EdgeSpecdecError, match=r"broken\.jinja is not valid Jinja \(line 1"):
        Pipeline(bundle_dir(*SAME_VOCAB), chat_template=broken, static_shapes=False)
    with pytest.raises(EdgeSpecdecError, match="chat_template"):
        Pipeline(bundle_dir(*SAME_VOCAB), chat_template=42)


def test_run_with_a_template_file_continues_the_rendered_conversation(bundle_dir, template_file, capsys):
    bundle = str(bundle_dir(*SAME_VOCAB))
    common = ["--max-new-tokens", "8", "--json"]
    assert main(["run", bundle, "--chat", "--prompt", "sort a list", "--chat-template", str(template_file),
                 *common]) == 0
    chat = json.loads(capsys.readouterr().out)
    assert main(["run", bundle, "--prompt", "[user: sort a list]\n[assistant: ", *common]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert chat["token_ids"] == plain["token_ids"] and chat["text"] == plain["text"]


@pytest.mark.slow
def test_chat_and_serve_take_a_template_file(bundle_dir, template_file):
    from serve_helpers import serve_command
    openai = pytest.importorskip("openai")

    bundle = str(bundle_dir(*SAME_VOCAB))
    chat = run_cli("chat", bundle, "--chat-template", str(template_file), "--max-new-tokens", "6",
                   input="sort a list\n")
    assert chat.returncode == 0 and "tokens/s" in chat.stderr, chat.stderr
    pipe = Pipeline(bundle, chat_template=template_file, static_shapes=False)
    expected = pipe.generate(pipe.chat_prompt(ASK), GenerationConfig(max_new_tokens=6)).text
    with serve_command(bundle, "--chat-template", str(template_file), env={"EDGE_SPECDEC_CACHE_DIR": "off"}) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)
        reply = client.chat.completions.create(model="x", messages=ASK, max_tokens=6, temperature=0)
    assert reply.choices[0].message.content == expected


def test_info_says_whether_the_template_holds_tools_and_a_system_message(bundle_dir, tmp_path, capsys):
    assert main(["info"]) == 0  # the demo
    out = capsys.readouterr().out
    assert "tools: yes, hermes calls (<tool_call> ... </tool_call>)" in out and "system message: yes" in out
    bundle = tmp_path / "pair"
    shutil.copytree(bundle_dir(*SAME_VOCAB), bundle)
    (bundle / "target" / "chat_template.jinja").write_text(REFUSES_SYSTEM)
    assert main(["info", str(bundle)]) == 0
    out = capsys.readouterr().out
    assert "tools: no (a request with tools gets 400" in out and "system message: no" in out


def test_rehash_records_a_deliberate_edit_and_says_what_changed(bundle_dir, tmp_path, capsys):
    bundle = tmp_path / "pair"
    shutil.copytree(bundle_dir(*SAME_VOCAB), bundle)
    config = bundle / "target" / "tokenizer_config.json"
    config.write_text(config.read_text().replace("{", '{"model_max_length": 512, ', 1))
    (bundle / "target" / "chat_template.jinja").write_text(BRACKETS)
    with pytest.raises(BundleError, match=r"tokenizer_config\.json has \d+ bytes but .*info .*--rehash"):
        load_bundle(bundle, verify=True)
    capsys.readouterr()
    assert main(["info", str(bundle), "--rehash"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("target/chat_template.jinja: added (")
    assert out[1].startswith("target/tokenizer_config.json: changed (") and "sha256" in out[1]
    assert "checksums verified" in out
    manifest = load_bundle(bundle, verify=True).manifest
    assert manifest["target"]["size_bytes"] == sum(p.stat().st_size for p in (bundle / "target").iterdir())
    assert main(["info", str(bundle), "--rehash"]) == 0
    assert capsys.readouterr().out.startswith("nothing changed")


def test_rehash_refuses_a_bundle_that_lacks_a_file_it_needs_and_writes_nothing(bundle_dir, tmp_path, capsys):
    bundle = tmp_path / "pair"
    shutil.copytree(bundle_dir(*SAME_VOCAB), bundle)
    (bundle / "draft" / "openvino_model.bin").unlink()
    before = tree_state(bundle)
    assert main(["info", str(bundle), "--rehash"]) == 1
    err = capsys.readouterr().err
    assert "lacks draft/openvino_model.bin, which a bundle needs: nothing recorded" in err, err
    assert tree_state(bundle) == before
    assert main(["info", "--rehash"]) == 1  # the demo ships inside the package: name the bundle to rehash
    assert "edge-specdec info DIR --rehash" in capsys.readouterr().err
