"""One Hugging Face model folder -> stateful OpenVINO IR with compressed weights, plus tokenizer IRs.

The model is first converted to a full-precision IR with optimum-intel, then compressed with NNCF through
optimum-intel's weight-only quantization (int4 / int8), or saved as fp16 / fp32.
"""
from __future__ import annotations

import contextlib
import logging
import shutil
import sys
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Union

from ..errors import ExportError, MissingDependencyError
from .checks import tokenizer_hints

WEIGHT_FORMATS = ("int4", "int8", "fp16", "fp32")
# Files copied from the source folder so that the runtime has the tokenizer, chat template and configs.
_SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "chat_template.jinja", "chat_template.json")


# The draft's weights for the device it will run on (`edge-specdec export --draft-preset`); options given
# explicitly win. npu: symmetric int8, one scale per channel. OpenVINO's NPU guide asks for symmetric weights
# (int4 or int8); asymmetric int4 has crashed the NPU compiler (openvinotoolkit/openvino#34450), and a small
# draft keeps its acceptance better in int8 than in int4. gpu: int4 in groups of 128, which the GPU plugin's
# int4 kernels run and which halves the bytes an iGPU reads from shared memory per step against int8.
DRAFT_PRESETS = {
    "npu": {"weights": "int8", "sym": True},
    "gpu": {"weights": "int4", "group_size": 128, "ratio": 1.0},
}


@dataclass(frozen=True)
class WeightSettings:
    """How one model's weights are stored.

    format: int4 | int8 | fp16 | fp32. For int4: group_size (-1 = per channel), ratio (share of layers in int4,
    the rest int8), sym, awq, scale_estimation; a calibration dataset (a text file, one sample per line, or a
    dataset name that optimum-intel knows such as "wikitext2", which needs the hub) for data-aware methods.
    group_size_fallback: what to do with layers whose width the group size does not divide: "adjust" (largest
    power of two that fits, else int8), "ignore" (leave them uncompressed) or "error".
    """
    format: str = "int4"
    group_size: Optional[int] = None
    ratio: Optional[float] = None
    sym: bool = False
    awq: bool = False
    scale_estimation: bool = False
    dataset: Optional[str] = None
    group_size_fallback: str = "adjust"
    preset: Optional[str] = None  # the device preset these settings came from (see DRAFT_PRESETS), for the record

    def validate(self, role: str) -> "WeightSettings":
        """Check the settings before any work; return them with the defaults filled in."""
        fmt = self.format
        if fmt not in WEIGHT_FORMATS:
            raise ExportError(f"--{role}-weights {fmt!r}: choose one of {', '.join(WEIGHT_FORMATS)}.")
        if fmt != "int4":
            extra = [name for name, on in (("--group-size", self.group_size is not None),
                                           ("--ratio", self.ratio is not None), ("--awq", self.awq),
                                           ("--scale-estimation", self.scale_estimation)) if on]
            if extra:
                raise ExportError(f"{role}: {', '.join(extra)} only apply to int4 weights, but the {role} is "
                                  f"{fmt}. Drop them or choose --{role}-weights int4.")
        group_size = self.group_size if self.group_size is not None else (128 if fmt == "int4" else None)
        ratio = self.ratio if self.ratio is not None else (1.0 if fmt == "int4" else None)
        if group_size is not None and group_size != -1 and group_size <= 0:
            raise ExportError(f"{role}: group size {group_size} is invalid; use a positive number such as 64 or 128, "
                              "or -1 for one scale per channel.")
        if ratio is not None and not 0.0 < ratio <= 1.0:
            raise ExportError(f"{role}: ratio {ratio} must be in (0, 1]: the share of layers compressed to int4.")
        if self.group_size_fallback not in ("adjust", "ignore", "error"):
            raise ExportError(f"{role}: group size fallback {self.group_size_fallback!r}: "
                              "choose adjust, ignore or error.")
        if self.scale_estimation and not self.dataset:
            raise ExportError(f"{role}: scale estimation needs calibration data: add --{role}-dataset FILE "
                              "(a text file with one sample per line).")
        if self.dataset and fmt not in ("int4", "int8"):
            raise ExportError(f"{role}: a calibration dataset only applies to int4/int8 weights.")
        if self.dataset and not Path(self.dataset).is_file() and self.dataset not in ("wikitext2", "c4", "auto"):
            raise ExportError(f"{role}: calibration dataset {self.dataset!r} is not a file. Pass a text file with "
                              "one sample per line (or wikitext2 / c4, which need the Hugging Face hub).")
        return WeightSettings(fmt, group_size, ratio, self.sym, self.awq, self.scale_estimation, self.dataset,
                              self.group_size_fallback, self.preset)

    def to_manifest(self) -> dict[str, Any]:
        return asdict(self)


def _calibration(dataset: Optional[str]) -> Union[None, str, list[str]]:
    if dataset is None:
        return None
    path = Path(dataset)
    if path.is_file():
        samples = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        if not samples:
            raise ExportError(f"calibration dataset {path} is empty: put one text sample per line.")
        return samples
    return dataset


def import_optimum():
    """Import the export stage's heavy dependencies, with a clear fix when they are missing or broken."""
    try:
        import nncf  # noqa: F401
        import torch  # noqa: F401
        from optimum.exporters.openvino import main_export
        from optimum.intel import OVConfig, OVModelForCausalLM, OVWeightQuantizationConfig
    except ImportError as exc:
        raise MissingDependencyError(
            f"the export stage needs optimum-intel, nncf, torch and transformers ({exc}). Install them with "
            "`pip install 'edge-specdec[export]'` (torch==2.13.0 is pinned there to keep pip from pulling a CUDA "
            "build).") from None
    except (RuntimeError, ModuleNotFoundError) as exc:
        if "torchvision" in str(exc) or "nms" in str(exc):
            raise MissingDependencyError(
                "torchvision does not match the installed torch and breaks optimum-intel's import "
                f"({exc}). edge-specdec does not use torchvision: `pip uninstall -y torchvision` fixes it.") from None
        raise
    return main_export, OVConfig, OVModelForCausalLM, OVWeightQuantizationConfig


@contextlib.contextmanager
def quiet_libraries(transformers_too: bool = True):
    """Silence the tracer warnings and info tables of torch/transformers/nncf during conversion.

    transformers_too=False leaves transformers alone (not imported) unless something imported it already: an export
    of OpenVINO IR sources alone imports neither transformers nor the torch it brings."""
    loggers = [logging.getLogger(name) for name in ("nncf", "transformers", "optimum", "openvino")]
    levels = [lg.level for lg in loggers]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        verbosity = None
        if transformers_too or "transformers" in sys.modules:
            try:
                import transformers
                verbosity = transformers.logging.get_verbosity()
                transformers.logging.set_verbosity_error()
                transformers.logging.disable_progress_bar()
            except ImportError:  # pragma: no cover
                pass
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels):
                lg.setLevel(level)
            if verbosity is not None:
                transformers.logging.set_verbosity(verbosity)
                transformers.logging.enable_progress_bar()


def export_model(source: Path, out: Path, settings: WeightSettings, scratch: Path,
                 progress: Callable[[str], None]) -> dict[str, Any]:
    """Convert the Hugging Face folder `source` into `out` (a fresh folder); return weight statistics."""
    main_export, OVConfig, OVModelForCausalLM, OVWeightQuantizationConfig = import_optimum()
    import openvino as ov

    full = scratch / "full-precision"
    try:
        main_export(str(source), full, task="text-generation-with-past", ov_config=OVConfig(dtype="fp32"),
                    stateful=True, convert_tokenizer=False)
    except Exception as exc:
        raise ExportError(f"optimum-intel could not convert {source} to OpenVINO ({type(exc).__name__}: {exc}). "
                          "Check that the architecture is supported by optimum-intel (Llama, Qwen2, Mistral, Phi, "
                          "GPT-2, ...).") from exc
    out.mkdir(parents=True, exist_ok=True)  # may already hold the tokenizer IRs: export_bundle converts them first
    if settings.format in ("fp16", "fp32"):
        model = ov.Core().read_model(full / "openvino_model.xml")
        ov.save_model(model, out / "openvino_model.xml", compress_to_fp16=settings.format == "fp16")
    else:
        config = OVWeightQuantizationConfig(
            bits=4 if settings.format == "int4" else 8, sym=settings.sym,
            group_size=settings.group_size if settings.format == "int4" else -1,
            ratio=settings.ratio if settings.format == "int4" else 1.0,
            quant_method="awq" if settings.awq else "default",
            scale_estimation=settings.scale_estimation or None,
            dataset=_calibration(settings.dataset), tokenizer=str(source) if settings.dataset else None,
            group_size_fallback=settings.group_size_fallback)
        try:
            model = OVModelForCausalLM.from_pretrained(full, quantization_config=config, compile=False)
            model.save_pretrained(scratch / "compressed")
        except Exception as exc:
            raise ExportError(f"NNCF could not compress {source} to {settings.format} ({type(exc).__name__}: {exc}). "
                              "For small models try --group-size 32 or 64, or a group size fallback of adjust.") \
                from exc
        for name in ("openvino_model.xml", "openvino_model.bin"):
            shutil.move(scratch / "compressed" / name, out / name)
    for name in _SIDE_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, out / name)
    return weight_statistics(out / "openvino_model.xml")


def weight_statistics(model_xml: Path, model: Any = None) -> dict[str, Any]:
    """How many weight elements the IR stores in each element type (e.g. u4 / u8 / f16 / f32).

    model: the IR already read from model_xml, if the caller has it (it is read otherwise)."""
    import openvino as ov

    counts: dict[str, int] = {}
    for op in (model if model is not None else ov.Core().read_model(model_xml)).get_ops():
        if op.get_type_name() != "Constant":
            continue
        etype = op.get_output_element_type(0).get_type_name()
        if etype in ("u4", "i4", "u8", "i8", "f16", "bf16", "f32", "nf4", "f8e4m3"):
            shape = op.get_output_shape(0)
            n = 1
            for dim in shape:
                n *= dim
            if n >= 256:  # weights, not small scalar constants
                counts[etype] = counts.get(etype, 0) + n
    total = sum(counts.values()) or 1
    return {"elements_by_type": counts, "share_by_type": {k: round(v / total, 4) for k, v in counts.items()}}


# Spot checks of the converted tokenizer against the Hugging Face one, run at every export.
PARITY_STRINGS = ("Hello world", " ", "  two  spaces", "tabs\tand\nnew lines\r\n", "def f(x):\n    return x + 1",
                  "emoji 😀 and 中文 and e\u0301", "ÀÉÎÕÜ ß", "1234567890 3.14")


def export_tokenizer(source: Path, out: Path, name: Optional[str] = None) -> None:
    """Convert the source's Hugging Face tokenizer to OpenVINO tokenizer and detokenizer IRs in `out`.

    name: how to call the source in errors (the user's own words for it; default the folder)."""
    name = name or str(source)
    import openvino as ov
    try:
        from openvino_tokenizers import convert_tokenizer
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise MissingDependencyError(f"tokenizer conversion needs openvino-tokenizers and transformers ({exc}): "
                                     "pip install 'edge-specdec[export]'.") from None
    # Known openvino-tokenizers limitations found in tokenizer.json: they explain a failure below, if any.
    hints = "".join(f" Known cause: {h}." for h in tokenizer_hints(source))
    hf = AutoTokenizer.from_pretrained(source)
    try:
        tokenizer, detokenizer = convert_tokenizer(hf, with_detokenizer=True, skip_special_tokens=True)
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        raise ExportError(f"openvino-tokenizers could not convert the tokenizer of {name} "
                          f"({type(exc).__name__}: {reason}). The runtime needs it; a tokenizer.json with a "
                          f"supported pre-tokenizer is required.{hints}") from exc
    ov.save_model(tokenizer, out / "openvino_tokenizer.xml")
    ov.save_model(detokenizer, out / "openvino_detokenizer.xml")
    for fname in ("openvino_tokenizer.xml", "openvino_tokenizer.bin", "openvino_detokenizer.xml",
                  "openvino_detokenizer.bin"):
        if not (out / fname).is_file() or (out / fname).stat().st_size == 0:
            raise ExportError(f"tokenizer conversion for {name} did not write {fname}: openvino-tokenizers "
                              "skipped it. The runtime cannot work without it; check the tokenizer.json.")
    encode = ov.Core().compile_model(out / "openvino_tokenizer.xml", "CPU")
    for text in PARITY_STRINGS:
        want = hf(text)["input_ids"]
        got = encode([text])["input_ids"][0].tolist()
        if got != want:
            raise ExportError(f"the OpenVINO tokenizer converted from {name} disagrees with its Hugging Face "
                              f"tokenizer on {text!r}: {got[:12]} vs {want[:12]}. The runtime would see other "
                              "tokens than the model was trained on. If the source is a .gguf file, export from "
                              f"the original Hugging Face folder instead.{hints}")
