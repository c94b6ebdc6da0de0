"""An OpenVINO IR folder as a source: checked, read and copied into a bundle as it is, without torch.

People who run models with OpenVINO already hold converted folders (optimum-cli's output, or the int4/int8 models
OpenVINO publishes on the Hugging Face hub): openvino_model.xml/.bin, a stateful LLM, beside config.json,
tokenizer.json and usually the converted openvino_tokenizer/openvino_detokenizer IRs. Such a folder goes into a
bundle without converting or recompressing the weights; what the bundle needs besides the model (the vocabulary
map, the token-bytes tables, the special tokens) is read from tokenizer.json and the configs as for a Hugging Face
folder.

Nothing here imports torch, transformers, optimum or nncf. Only a folder whose tokenizer is not converted yet needs
transformers (openvino-tokenizers converts from a transformers tokenizer): that conversion runs in a child process
in which torch cannot be imported (transformers 5 imports torch with its tokenizers whenever torch is installed).
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import unicodedata
from dataclasses import dataclass, replace
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Callable, Optional

from ..errors import ExportError
from .checks import folder_architecture, runtime_problem
from .convert import PARITY_STRINGS, WeightSettings, weight_statistics
from .token_bytes import token_table

MODEL_FILES = ("openvino_model.xml", "openvino_model.bin")
TOKENIZER_FILES = ("openvino_tokenizer.xml", "openvino_tokenizer.bin", "openvino_detokenizer.xml",
                   "openvino_detokenizer.bin")
# The inputs the runtime feeds a stateful LLM (runtime/session.py), in the order optimum-intel exports them.
RUNTIME_INPUTS = ("input_ids", "attention_mask", "position_ids", "beam_idx")
# Files copied beside the model when present: the configs, tokenizer.json and the chat template.
SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json", "chat_template.jinja", "chat_template.json")
OPTIMUM_CLI_FIX = ("export the Hugging Face model with `optimum-cli export openvino --model MODEL "
                   "--task text-generation-with-past --weight-format int4 OUT` (stateful by default) and pass OUT")
# Element types of weight constants, by the weight format they stand for (nf4, NNCF's 4-bit float, counts as
# 4-bit weights; an fp8 IR is recorded as such, a format the export itself does not write).
_FORMAT_OF_TYPE = {"u4": "int4", "i4": "int4", "nf4": "int4", "u8": "int8", "i8": "int8", "f8e4m3": "fp8",
                   "f16": "fp16", "bf16": "fp16", "f32": "fp32"}
# The keys of NNCF's weight_compression record (the IR's rt_info) kept in the manifest.
_COMPRESSION_KEYS = ("mode", "group_size", "ratio", "awq", "scale_estimation")


@dataclass(frozen=True)
class IRModel:
    """What the checks read from an IR folder: the weights record for the manifest and the parameter count."""
    folder: Path
    weights: dict[str, Any]        # {"format": int4|int8|fp16|fp32, "kept": ..., NNCF's record, elements by type}
    num_parameters: int
    tokenizer_how: str = ""        # where the bundle's tokenizer IRs came from, once ir_tokenizer() has run

    @property
    def weight_format(self) -> str:
        return self.weights["format"]

    def with_tokenizer(self, how: str) -> "IRModel":
        return replace(self, tokenizer_how=how)


def _check_runtime_admits(folder: Path, where: str) -> None:
    """Refuse, in one line, a model whose config.json says the runtime cannot decode it exactly (recurrent layers,
    positions that switch with the length, attention-logit softcapping: checks.runtime_problem)."""
    try:
        arch = folder_architecture(folder)
    except (OSError, ValueError) as exc:
        raise ExportError(f"{where}: its config.json cannot be read ({exc}); copy the model's config.json from its "
                          "Hugging Face repository into the folder.") from None
    refusal = runtime_problem(arch.config or {})
    if refusal is not None:
        raise ExportError(f"{where}: {arch.describe()} {refusal}")


def inspect_ir_folder(folder: Path, role: str, given: str) -> IRModel:
    """Check that `folder` is a stateful LLM the runtime can run, and read its weights; raise a one-line ExportError
    naming what is missing and the fix. Reads the IR (the weights are memory-mapped, not loaded) and writes nothing."""
    import openvino as ov

    where = f"--{role} {given}"
    if not (folder / MODEL_FILES[1]).is_file():
        raise ExportError(f"{where}: openvino_model.xml without its weights openvino_model.bin beside it; copy the "
                          "whole model folder, or " + OPTIMUM_CLI_FIX + ".")
    try:
        model = ov.Core().read_model(folder / MODEL_FILES[0])
    except Exception as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise ExportError(f"{where}: openvino_model.xml is not a model OpenVINO can read ({reason}); "
                          + OPTIMUM_CLI_FIX + ".") from None
    inputs = [i.get_any_name() for i in model.inputs]
    stateful = bool(model.get_sinks()) or "beam_idx" in inputs
    if not stateful:
        shown = ", ".join(inputs[:4]) + (", ..." if len(inputs) > 4 else "")
        raise ExportError(f"{where}: not a stateful LLM (no KV-cache state and no beam_idx input; its inputs are "
                          f"{shown}), and edge-specdec keeps the KV cache in the model's state: "
                          + OPTIMUM_CLI_FIX + ", without --disable-stateful.")
    missing = [name for name in RUNTIME_INPUTS if name not in inputs]
    extra = [name for name in inputs if name not in RUNTIME_INPUTS]
    if missing or extra:
        what = "; ".join(part for part in (f"lacks the inputs {', '.join(missing)}" if missing else "",
                                           f"has inputs the runtime does not feed ({', '.join(extra)})" if extra
                                           else "") if part)
        raise ExportError(f"{where}: a stateful model, but it {what}: the runtime feeds exactly "
                          f"{', '.join(RUNTIME_INPUTS)}, as a text-generation-with-past export has them; "
                          + OPTIMUM_CLI_FIX + ".")
    if not any("logits" in out.get_names() for out in model.outputs):
        raise ExportError(f"{where}: the model has no output named logits, which the runtime reads; "
                          + OPTIMUM_CLI_FIX + ".")
    if not (folder / "tokenizer.json").is_file():
        raise ExportError(f"{where}: no tokenizer.json beside the model; the bundle's vocabulary map and special "
                          "tokens are read from it: copy the model's tokenizer.json (and tokenizer_config.json) from "
                          "its Hugging Face repository into the folder.")
    if not (folder / "config.json").is_file():
        raise ExportError(f"{where}: no config.json beside the model; the bundle's architecture and context are read "
                          "from it: copy the model's config.json from its Hugging Face repository into the folder "
                          "(optimum-cli writes it there).")
    _check_runtime_admits(folder, where)
    _check_tokenizer_fits(model, folder, where)
    converted = all((folder / name).is_file() for name in TOKENIZER_FILES)
    if not converted and find_spec("transformers") is None:  # find_spec looks for it without importing it
        raise ExportError(f"{where}: no converted tokenizer (openvino_tokenizer.xml, openvino_detokenizer.xml) in "
                          "the folder, and converting its tokenizer.json with openvino-tokenizers needs transformers: "
                          "pip install transformers, or export with optimum-cli, which converts it.")
    stats = weight_statistics(folder / MODEL_FILES[0], model)
    weights = {"format": weight_format(stats["elements_by_type"]), "kept": "as in the OpenVINO IR",
               **compression_record(model), **stats}
    return IRModel(folder, weights, count_parameters(model))


def _check_tokenizer_fits(model, folder: Path, where: str) -> None:
    """The tokenizer.json beside the model must be the model's: none of its ids may lie past the model's logits
    (fewer tokens than logits is usual: the logits are padded)."""
    width = model.output("logits").get_partial_shape()[2]
    tokens = len(token_table(folder))
    if width.is_static and tokens > width.get_length():
        raise ExportError(f"{where}: its tokenizer.json has {tokens} tokens but the model has {width.get_length()} "
                          f"logits, so ids {width.get_length()} to {tokens - 1} could never be written: the tokenizer "
                          "is not this model's; copy the model's own tokenizer.json (and tokenizer_config.json) from "
                          "its Hugging Face repository into the folder.")


def weight_format(elements_by_type: dict[str, int]) -> str:
    """int4 | int8 | fp16 | fp32 from the element types of the weight constants: int4 as soon as any weight is
    4-bit (NNCF keeps the embeddings and the output layer in int8 by default), else the type most weights are in."""
    by_format: dict[str, int] = {}
    for etype, count in elements_by_type.items():
        fmt = _FORMAT_OF_TYPE.get(etype)
        if fmt is not None:
            by_format[fmt] = by_format.get(fmt, 0) + count
    if not by_format:
        return "fp32"
    if "int4" in by_format:
        return "int4"
    return max(by_format, key=by_format.get)


def compression_record(model) -> dict[str, Any]:
    """NNCF's settings as the IR records them in its rt_info (optimum-cli's and OpenVINO's published models do):
    mode (int4_sym, int8_asym ...), sym read from it, group size, ratio, awq and scale estimation; {} when the IR
    does not say (an fp16/fp32 IR, or one compressed by other means)."""
    try:
        record = model.get_rt_info()["nncf"]["weight_compression"]
        values = {key: record[key].astype(str) for key in _COMPRESSION_KEYS if key in record}
    except Exception:
        return {}
    out: dict[str, Any] = {}
    for key, text in values.items():
        if text in ("True", "False"):
            out[key] = text == "True"
        else:
            try:
                out[key] = int(text) if key == "group_size" else float(text) if key == "ratio" else text
            except ValueError:
                out[key] = text
    if isinstance(out.get("mode"), str):
        out["sym"] = out["mode"].endswith("_sym")
    return out


def count_parameters(model) -> int:
    """The model's parameters, counted from its constants: every weight of float or 4/8-bit integer type except the
    scales and zero points that decompress compressed weights (they feed the Subtract/Multiply after a weight's
    Convert). Like the Hugging Face route's count (the tensors its safetensors store), it counts what is stored:
    an int4 Qwen2.5-Coder-1.5B IR counts 1777088064 against 1777088000 from its safetensors."""
    weight_types = set(_FORMAT_OF_TYPE)
    total = 0
    for op in model.get_ops():
        if op.get_type_name() != "Constant":
            continue
        if op.get_output_element_type(0).get_type_name() not in weight_types:
            continue
        shape = op.get_output_partial_shape(0)
        if shape.is_dynamic or shape.rank.get_length() == 0:
            continue
        n = 1
        for dim in op.get_output_shape(0):
            n *= dim
        if n > 1 and not _decompresses_a_weight(op):
            total += n
    return total


def _decompresses_a_weight(constant) -> bool:
    """True for a scale or zero point: the constant (through a Convert, for a zero point) is the second input of a
    Subtract or Multiply whose first input is a converted weight."""
    outputs = [constant.output(0)]
    consumers = [t for out in outputs for t in out.get_target_inputs()]
    if consumers and all(t.get_node().get_type_name() == "Convert" for t in consumers):
        consumers = [t2 for t in consumers for t2 in t.get_node().output(0).get_target_inputs()]
    for target in consumers:
        node = target.get_node()
        if node.get_type_name() in ("Subtract", "Multiply") and target.get_index() == 1:
            first = node.input_value(0).get_node().get_type_name()
            if first in ("Convert", "Subtract", "Reshape"):
                return True
    return False


def check_ir_weights(settings: Optional[WeightSettings], ir: IRModel, role: str, given: str) -> None:
    """Weight options given for an IR source must describe the weights it has: they are kept, not converted."""
    if settings is None:
        return
    others = [name for name, on in (("group size", settings.group_size is not None),
                                    ("ratio", settings.ratio is not None), ("sym", settings.sym),
                                    ("awq", settings.awq), ("scale estimation", settings.scale_estimation),
                                    ("dataset", settings.dataset is not None), ("preset", settings.preset is not None))
              if on]
    if settings.format not in (None, ir.weight_format) or others:
        asked = settings.format if settings.format not in (None, ir.weight_format) else ", ".join(others)
        raise ExportError(f"--{role} {given}: an OpenVINO IR folder whose {ir.weight_format} weights go into the "
                          f"bundle as they are, so the {role} weight options ({asked}) cannot apply: drop them, or "
                          "export from the Hugging Face model to compress its weights otherwise.")


def copy_ir_model(folder: Path, out: Path) -> None:
    """Copy the model IR and the side files into the bundle's role folder `out` (which may hold the tokenizer
    IRs already). Copied, not linked: the bundle stands alone, whatever later happens to the source folder."""
    out.mkdir(parents=True, exist_ok=True)
    for name in MODEL_FILES + SIDE_FILES:
        if (folder / name).is_file():
            shutil.copyfile(folder / name, out / name)


def ir_tokenizer(folder: Path, out: Path, name: str, say: Callable[[str], None]) -> str:
    """Put the IR folder's tokenizer and detokenizer IRs into `out`; return how they were obtained.

    The folder's own converted IRs are used when they load with the installed openvino-tokenizers and belong to its
    tokenizer.json (see _converted_tokenizer_problem); otherwise tokenizer.json is converted with
    openvino-tokenizers and checked against the transformers tokenizer, as for a Hugging Face folder."""
    out.mkdir(parents=True, exist_ok=True)
    if all((folder / f).is_file() for f in TOKENIZER_FILES):
        problem = _converted_tokenizer_problem(folder)
        if problem is None:
            for f in TOKENIZER_FILES:
                shutil.copyfile(folder / f, out / f)
            return "the folder's converted IRs"
        say(f"the tokenizer IRs in {name} are not used ({problem}): converting its tokenizer.json")
    _convert_in_child(folder, out, name)
    return "converted from tokenizer.json by openvino-tokenizers"


def _converted_tokenizer_problem(folder: Path) -> Optional[str]:
    """None if the folder's tokenizer IRs load and belong to its tokenizer.json, else why not.

    Belonging: on each parity string, the ids the tokenizer IR gives spell the string itself in tokenizer.json's
    vocabulary (the bytes of those tokens, special tokens left out), up to Unicode normalization and the space a
    SentencePiece-style tokenizer prepends. An IR of another vocabulary (a stale or swapped file) spells something
    else. The ids are not compared with the Hugging Face tokenizer's: that needs transformers, and with it torch,
    and tokenizer.json alone is not the reference (transformers 5 adds an NFC normalizer to Qwen2's, which its
    tokenizer.json does not hold); optimum-cli converts with openvino-tokenizers from transformers' tokenizer, with
    the settings this export uses."""
    import openvino as ov
    import openvino_tokenizers  # noqa: F401  - registers the tokenizer operations with OpenVINO

    try:
        encode = ov.Core().compile_model(folder / "openvino_tokenizer.xml", "CPU")
        ov.Core().read_model(folder / "openvino_detokenizer.xml")
    except Exception as exc:
        return f"the installed openvino-tokenizers cannot load them: {(str(exc).strip().splitlines() or [''])[0][:120]}"
    pieces = token_table(folder).pieces
    for text in PARITY_STRINGS:
        ids = encode([text])["input_ids"][0].tolist()
        if any(not 0 <= i < len(pieces) for i in ids):
            return f"they give token ids outside tokenizer.json's {len(pieces)} tokens for {text!r}"
        spelled = b"".join(pieces[i] for i in ids if pieces[i] is not None).decode("utf-8", errors="replace")
        forms = {text, unicodedata.normalize("NFC", text), unicodedata.normalize("NFKC", text)}
        if spelled not in forms | {" " + form for form in forms}:
            return f"their ids for {text!r} spell {spelled[:40]!r} in tokenizer.json's vocabulary"
    return None


# Run in the child: torch made unimportable first (transformers then loads its tokenizers without it).
_CHILD = """
import sys
sys.modules["torch"] = None
from pathlib import Path
from edge_specdec.errors import EdgeSpecdecError
from edge_specdec.export.convert import export_tokenizer
try:
    export_tokenizer(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
except EdgeSpecdecError as exc:
    print(str(exc).replace("\\n", " "), file=sys.stderr)
    sys.exit(2)
"""


def _convert_in_child(folder: Path, out: Path, name: str) -> None:
    """export_tokenizer() (convert, then compare with the transformers tokenizer) in a child process without torch."""
    done = subprocess.run([sys.executable, "-c", _CHILD, str(folder), str(out), name], capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        raise ExportError(lines[-1] if lines else f"the tokenizer conversion of {name} failed "
                          f"(exit code {done.returncode})")
