"""The target's chat template (Hugging Face Jinja format), rendered without transformers.

jinja2 is the one runtime dependency beyond OpenVINO and numpy: chat templates are Jinja programs, and
re-implementing Jinja would be worse than depending on it.
"""
from __future__ import annotations

import json
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
    def from_model_folder(cls, folder: Path) -> Optional["ChatTemplate"]:
        """The template saved beside a model's tokenizer (chat_template.jinja, or tokenizer_config.json)."""
        config_path = folder / "tokenizer_config.json"
        config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.exists() else {}
        jinja = folder / "chat_template.jinja"
        source = jinja.read_text(encoding="utf-8") if jinja.exists() else config.get("chat_template")
        if isinstance(source, list):  # several named templates: take the default one
            source = next((t["template"] for t in source if t.get("name") == "default"), None)
        if not source:
            return None
        return cls(source, _token_text(config.get("bos_token")), _token_text(config.get("eos_token")))

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


def _token_text(token) -> str:
    if isinstance(token, dict):
        return token.get("content", "")
    return token or ""


def _raise(message: str):
    raise EdgeSpecdecError(f"the chat template refused the conversation: {message}")
