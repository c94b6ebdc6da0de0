"""The target's chat template (Hugging Face Jinja format), rendered without transformers.

jinja2 is the one runtime dependency beyond OpenVINO and numpy: chat templates are Jinja programs, and
re-implementing Jinja would be worse than depending on it.
"""
from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any, Optional

from ..errors import EdgeSpecdecError


class ChatTemplate:
    def __init__(self, source: str, bos_token: str = "", eos_token: str = ""):
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
        env.globals["raise_exception"] = _raise
        self.template = env.from_string(source)
        self.source, self.bos_token, self.eos_token = source, bos_token, eos_token

    @classmethod
    def from_model_folder(cls, folder: Path, file: Optional[Path] = None) -> Optional["ChatTemplate"]:
        """The template saved beside a model's tokenizer (chat_template.jinja, or tokenizer_config.json), or the
        one in `file` (a Jinja template, as llama-server's --chat-template-file takes), with the BOS and EOS
        texts of the model's tokenizer_config.json either way."""
        config_path = folder / "tokenizer_config.json"
        config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.exists() else {}
        jinja = folder / "chat_template.jinja"
        if file is not None:
            source = _read_template(file)
        else:
            source = jinja.read_text(encoding="utf-8") if jinja.exists() else config.get("chat_template")
        if isinstance(source, list):  # several named templates: take the default one
            source = next((t["template"] for t in source if t.get("name") == "default"), None)
        if not source:
            return None
        from jinja2 import TemplateSyntaxError

        try:
            return cls(source, _token_text(config.get("bos_token")), _token_text(config.get("eos_token")))
        except TemplateSyntaxError as exc:
            where = file or folder
            raise EdgeSpecdecError(f"the chat template {where} is not valid Jinja (line {exc.lineno}: {exc.message}):"
                                   f" fix the template.") from None

    def accepts_system_message(self) -> bool:
        """Whether the template shows the model a system message (some refuse one, some leave it out)."""
        probe = "system-message-probe"
        try:
            text = self.render([{"role": "system", "content": probe}, {"role": "user", "content": "hello"}])
        except Exception:  # the template raised: it refuses the role
            return False
        return probe in text

    @cached_property
    def user_opening(self) -> Optional[str]:
        """The text the template writes right before a user message's own text: the end of the turn before, if
        any, and the start of a user turn (ChatML: "<|im_start|>user\\n"; Qwen's, which always writes a system turn
        first: "<|im_end|>\\n<|im_start|>user\\n"). Learned from two probe conversations, one user message alone
        and one after an exchange: the longest text both renderings put right before the probed message's text.
        None where there is none (the template raised on the probes, or writes no markup before a user message):
        a prompt's chat head (draft_window.chat_head_length) is then unknown."""
        mark, reply = "edge-specdec-probe-message", "edge-specdec-probe-reply"
        try:
            alone = self.render([{"role": "user", "content": mark}])
            after = self.render([{"role": "user", "content": "hello"}, {"role": "assistant", "content": reply},
                                 {"role": "user", "content": mark}])
        except Exception:  # a template that refuses the probes: no opening known
            return None
        if alone.count(mark) != 1 or after.count(mark) != 1 or after.count(reply) != 1:
            return None
        first, between = alone[:alone.index(mark)], after[after.index(reply) + len(reply):after.index(mark)]
        shared = 0  # the length of the longest end the two share
        while shared < min(len(first), len(between)) and first[-1 - shared] == between[-1 - shared]:
            shared += 1
        opening = between[len(between) - shared:]
        return opening if opening.strip() else None

    @cached_property
    def answer_opening(self) -> Optional[str]:
        """The text the template writes where the assistant's answer starts: what its generation prompt adds after
        a conversation (ChatML: "<|im_start|>assistant\\n"), which marks where each earlier answer starts in a
        prompt too (session.py, "A chat's turns"). None where it adds nothing, or the template raised on the probe."""
        messages = [{"role": "user", "content": "edge-specdec-probe-message"}]
        texts = {"bos_token": self.bos_token, "eos_token": self.eos_token}
        try:
            bare = self.template.render(messages=messages, add_generation_prompt=False, **texts)
            opened = self.template.render(messages=messages, add_generation_prompt=True, **texts)
        except Exception:  # a template that refuses the probe: no opening known
            return None
        opening = opened[len(bare):]
        return opening if opened.startswith(bare) and opening.strip() else None

    def render(self, messages: list[dict], tools: Optional[list[dict]] = None) -> str:
        """The prompt text for a conversation, ending where the assistant's reply starts; tools (OpenAI's
        function list) go to the template, which tells the model about them its own way."""
        extra = {"tools": tools} if tools else {}
        return self.template.render(messages=messages, add_generation_prompt=True, bos_token=self.bos_token,
                                    eos_token=self.eos_token, **extra)


def special_token_texts(folder: Path, special: dict[str, Any]) -> dict[int, str]:
    """Special token id -> the text that spells it in a chat template: tokenizer.json's added tokens in the model
    folder, else the BOS and EOS of `special` (a bundle model's special_tokens)."""
    texts = {special[f"{name}_token_id"]: special[f"{name}_token"] for name in ("bos", "eos")
             if isinstance(special.get(f"{name}_token_id"), int) and isinstance(special.get(f"{name}_token"), str)}
    try:
        added = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8")).get("added_tokens", [])
    except (OSError, ValueError):
        added = []
    texts.update({t["id"]: t["content"] for t in added if isinstance(t.get("id"), int) and t.get("content")})
    return texts


def _read_template(file: Path) -> str:
    """A chat template file's text, or an error that names the file and the fix."""
    try:
        source = Path(file).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise EdgeSpecdecError(f"cannot read the chat template {file} ({reason}): pass the path of a Jinja chat "
                               f"template file, such as a model's chat_template.jinja.") from None
    if not source.strip():
        raise EdgeSpecdecError(f"the chat template {file} is empty: pass a Jinja chat template file.")
    return source


def _token_text(token) -> str:
    if isinstance(token, dict):
        return token.get("content", "")
    return token or ""


def _raise(message: str):
    raise EdgeSpecdecError(f"the chat template refused the conversation: {message}")
