"""Chat: the prompt in the model's chat template, a clear error without one, and `run --chat` over stdin."""
from __future__ import annotations

import shutil

import pytest

from edge_specdec.errors import EdgeSpecdecError
from edge_specdec.runtime import Pipeline
from edge_specdec.runtime.chat import ChatTemplate
from support import SAME_VOCAB, run_cli

CHAT = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>\n{% endfor %}" \
       "{% if add_generation_prompt %}<assistant>{% endif %}"


@pytest.fixture(scope="module")
def pipe(bundle_dir):
    return Pipeline(bundle_dir(*SAME_VOCAB))


def test_chat_prompt_uses_the_template(pipe):
    pipe.__dict__["chat_template"] = ChatTemplate(CHAT)
    try:
        ids = pipe.chat_prompt([{"role": "user", "content": "hi there"}])
        assert ids == pipe.tokenizer.encode("<user>hi there</user>\n<assistant>")
    finally:
        del pipe.__dict__["chat_template"]


def test_chat_without_template_is_a_clear_error(pipe):
    assert pipe.chat_template is None
    with pytest.raises(EdgeSpecdecError, match="has no chat template"):
        pipe.chat_prompt([{"role": "user", "content": "hi"}])


@pytest.mark.slow
def test_cli_chat_session_over_stdin(bundle_dir, tmp_path):
    bundle = tmp_path / "bundle"
    shutil.copytree(bundle_dir(*SAME_VOCAB), bundle)
    (bundle / "target" / "chat_template.jinja").write_text(CHAT)
    proc = run_cli("run", str(bundle), "--chat", "--max-new-tokens", "6", input="hello\nand again\n\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count(" target pass") == 2 and "target on CPU, draft on CPU" in proc.stderr  # two answers
    single = run_cli("run", str(bundle), "--chat", "--prompt", "hello", "--max-new-tokens", "6", "--json")
    assert single.returncode == 0, single.stderr
    no_template = run_cli("run", str(bundle_dir(*SAME_VOCAB)), "--chat", input="hello\n")
    assert no_template.returncode == 1 and "has no chat template" in no_template.stderr
