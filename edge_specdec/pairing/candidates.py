"""The candidates of `edge-specdec pair` and the cheap first look at each: what a source is, its vocabulary as
bytes (from tokenizer.json or the GGUF header, nothing converted), how the draft's vocabulary relates to the
target's, the weights it adds, and whether the export would admit it.

A source is a Hugging Face folder, a .gguf file, an OpenVINO IR folder, a bundle (its target or its draft), a name
from the pair catalog (its target or its draft), or a hub id (its tokenizer.json alone is fetched for the look); a
folder that is none of these is scanned for candidates one level down.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from ..bundle import MANIFEST_FILE
from ..errors import EdgeSpecdecError
from ..export.sources import IR_MODEL_XML, count_parameters, is_hub_id, is_ir_folder
from ..export.token_bytes import _piece_bytes, token_table
from ..runtime.algorithms import auto_algorithm

# what each source kind is called in the report
KINDS = {"hf": "Hugging Face folder", "gguf": "GGUF file", "ir": "OpenVINO IR folder", "bundle": "bundle",
         "hub": "hub id"}
# bytes per parameter of the weights export writes by default (int4 target, int8 draft; int4 groups add scales)
DEFAULT_BYTES_PER_PARAMETER = {"target": 0.56, "draft": 1.0}
# a draft with at least this share of the target's parameters costs about as much per step as the target: it
# cannot pay, and the export refuses one that is larger
NOT_SMALLER = 0.8
_GGUF_CONTROL, _GGUF_USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values (gguf_tokenizer.py names them too)
_GGUF_STYLES = {"gpt2": "bytelevel", "llama": "metaspace", "gemma4": "metaspace"}


@dataclass
class Source:
    """One model as given: its kind, the local path the look and the export read (None for a hub id until
    fetched), and for a bundle the role inside it."""
    given: str
    kind: str
    path: Optional[Path]
    name: str

    @property
    def export_source(self) -> str:
        """What export_bundle takes for it: a bundle's model is the IR folder inside it."""
        return str(self.path) if self.path is not None else self.given


@dataclass
class Vocabulary:
    """A tokenizer's tokens as bytes (None: a special token), and whether each is a byte-fallback token."""
    pieces: list[Optional[bytes]]
    byte_fallback: list[bool]
    style: str


@dataclass
class Candidate:
    """A draft for the target, or one of the two choices without a draft model (source None)."""
    name: str
    source: Optional[Source]
    algorithm: str = "none"            # what the simulation runs: a fixed algorithm, or auto for a draft model
    relation: str = "target-only"
    vocabulary: dict[str, Any] = field(default_factory=dict)
    auto: dict[str, str] = field(default_factory=dict)   # greedy/sampled -> the algorithm auto runs
    weights_bytes: int = 0
    weights_note: str = ""
    refused: str = ""                  # why the export would refuse it, and the fix, in one line ("" admitted)
    bundle: Optional[Path] = None      # its bundle, once exported
    placement: Optional[dict[str, Any]] = None  # where its simulated engine put the models (target, draft)

    @property
    def has_draft(self) -> bool:
        return self.source is not None


def classify(given: str, role: str, catalog: Optional[dict[str, dict[str, Any]]] = None) -> list[Source]:
    """The sources `given` names for a role ("target" or "draft"): one, or for a folder of candidates each one
    found in it (drafts only). EdgeSpecdecError names what it is not and what to pass instead."""
    path = Path(given).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        return [Source(given, "gguf", path, path.name)]
    if path.is_dir():
        found = _source_in_folder(given, path, role)
        if found is not None:
            return [found]
        if role == "draft":
            inside = [s for child in sorted(path.iterdir()) for s in _scanned(child, role)]
            if inside:
                return inside
        raise EdgeSpecdecError(f"{given}: neither a model (a Hugging Face folder with config.json, an OpenVINO IR "
                               f"folder with {IR_MODEL_XML}, a bundle) nor a folder that holds models or .gguf "
                               "files. Pass one of these.")
    if path.exists():
        raise EdgeSpecdecError(f"{given}: a file, but not a .gguf file. Pass a model folder, a .gguf file, a "
                               "bundle or a catalog name (`edge-specdec pairs`).")
    if catalog and given in catalog:
        return classify(catalog[given][role], role, catalog)
    if is_hub_id(given):
        return [Source(given, "hub", None, given.split("/")[-1])]
    raise EdgeSpecdecError(f"{given}: no such file or folder, no catalog name (`edge-specdec pairs` lists them) and "
                           "not a hub id of the form ORG/NAME.")


def _source_in_folder(given: str, path: Path, role: str) -> Optional[Source]:
    """The model a folder is (a bundle's for the role; None: the folder is no model)."""
    if (path / MANIFEST_FILE).is_file():
        inner = path / role
        if not inner.is_dir():
            raise EdgeSpecdecError(f"{given}: this bundle has no {role}. Pass a bundle with one, or the model "
                                   "itself.")
        return Source(given, "bundle", inner, path.name)
    if is_ir_folder(path):
        return Source(given, "ir", path, path.name)
    if (path / "config.json").is_file():
        return Source(given, "hf", path, path.name)
    return None


def _scanned(child: Path, role: str) -> list[Source]:
    """A scanned folder's entry as a candidate, if it is one (a bundle without a draft is not)."""
    if child.is_file() and child.suffix.lower() == ".gguf":
        return [Source(str(child), "gguf", child, child.name)]
    if not child.is_dir() or ((child / MANIFEST_FILE).is_file() and not (child / role).is_dir()):
        return []
    found = _source_in_folder(str(child), child, role)
    return [found] if found is not None else []


def read_vocabulary(source: Source) -> Vocabulary:
    """The source's tokens as bytes, read from its tokenizer.json, or from a GGUF file's tokenizer.ggml fields;
    a hub id's tokenizer.json is fetched alone (the hub cache serves it offline)."""
    if source.kind == "gguf":
        return gguf_vocabulary(source.path)
    folder = source.path if source.path is not None else _hub_file(source.given, "tokenizer.json").parent
    table = token_table(folder)
    return Vocabulary(table.pieces, table.byte_fallback, table.style)


def _hub_file(repo_id: str, name: str) -> Path:
    try:
        from huggingface_hub import hf_hub_download
        return Path(hf_hub_download(repo_id, name))
    except ImportError:
        raise EdgeSpecdecError(f"{repo_id}: a hub id needs huggingface_hub: pip install 'edge-specdec[hub]', or "
                               "download the model and pass its folder.") from None
    except Exception as exc:  # offline without the file in the cache, an unknown repository
        raise EdgeSpecdecError(f"{repo_id}: could not fetch its {name} from the hub ({type(exc).__name__}). "
                               "Pass a local folder instead.") from None


def gguf_vocabulary(path: Path) -> Vocabulary:
    """A GGUF file's tokens as bytes, as llama.cpp spells them: byte-level BPE ("gpt2") draws bytes as GPT-2's
    characters; SentencePiece kinds write spaces as U+2581 with <0xNN> byte tokens; control tokens spell nothing,
    user-defined ones their text."""
    try:
        from ..export.gguf_tokenizer import gguf_tokenizer_fields
        fields = gguf_tokenizer_fields(path)
    except ImportError:
        raise EdgeSpecdecError(f"{path}: reading a GGUF header needs the gguf package: pip install gguf (or "
                               "'edge-specdec[export]').") from None
    style = _GGUF_STYLES.get(fields.get("model"))
    if style is None:
        raise EdgeSpecdecError(f"{path}: tokenizer.ggml.model {fields.get('model')!r} is not a kind edge-specdec "
                               "reads (gpt2, llama, gemma4); pass the model's Hugging Face folder instead.")
    types = list(fields.get("token_type") or [])
    fallback = style == "metaspace"
    pieces, flags = [], []
    for i, token in enumerate(fields["tokens"]):
        kind = types[i] if i < len(types) else 1
        if kind == _GGUF_CONTROL:
            pieces.append(None)
            flags.append(False)
        elif kind == _GGUF_USER_DEFINED:
            pieces.append(token.encode("utf-8"))
            flags.append(False)
        else:
            piece, is_byte = _piece_bytes(token, style, fallback)
            pieces.append(piece)
            flags.append(is_byte)
    return Vocabulary(pieces, flags, style)


def relate(target: Vocabulary, draft: Vocabulary, text: str) -> dict[str, Any]:
    """How the draft's vocabulary relates to the target's, from the tokens' bytes: identical or not; the share of
    the strings either spells that both spell the same; the shares of each side's tokens the other has (the
    draft's share decides auto's sampled algorithm); and how much of the target's text the draft spells with the
    same tokens (the target's tokens of `text`, split by the longest match, that the draft also has)."""
    t_set = {p for p in target.pieces if p}
    d_set = {p for p in draft.pieces if p}
    both = t_set & d_set
    identical = target.pieces == draft.pieces
    return {"relation": "identical" if identical else "heterogeneous",
            "target_tokens": len(t_set), "draft_tokens": len(d_set),
            "shared_share": round(len(both) / max(1, len(t_set | d_set)), 4),
            "target_share": round(len(both) / max(1, len(t_set)), 4),
            "draft_share": round(len(both) / max(1, len(d_set)), 4),
            "text_share": round(1.0 if identical else text_share(t_set, d_set, text), 4)}


def text_share(target_pieces: set[bytes], draft_pieces: set[bytes], text: str) -> float:
    """The share of the target's tokens in `text` (split greedily by the longest token that matches; a cheap
    stand-in for its tokenizer) that the draft's vocabulary also has."""
    data = text.encode("utf-8")
    longest = max((len(p) for p in target_pieces), default=1)
    tokens = kept = 0
    i = 0
    while i < len(data):
        for n in range(min(longest, len(data) - i), 0, -1):
            if data[i:i + n] in target_pieces or n == 1:
                tokens += 1
                kept += data[i:i + n] in draft_pieces
                i += n
                break
    return kept / tokens if tokens else 0.0


def weights(source: Source, role: str = "draft") -> tuple[int, str]:
    """The bytes of weights a source adds, and how that figure was read: an IR's or a bundle's .bin as it is; a
    Hugging Face folder's parameters at export's default weights for the role; a GGUF file's size."""
    if source.kind in ("ir", "bundle"):
        return (source.path / IR_MODEL_XML).with_suffix(".bin").stat().st_size, "its weights file"
    if source.kind == "hf":
        default = "int8" if role == "draft" else "int4"
        return (int(count_parameters(source.path) * DEFAULT_BYTES_PER_PARAMETER[role]),
                f"estimated at {default}, export's default for a {role}")
    if source.kind == "gguf":
        return source.path.stat().st_size, "the GGUF file's size (export dequantizes and compresses it again)"
    return 0, "not known before the download"


def admission(source: Source, role: str = "draft") -> str:
    """Why the export would refuse this source, with the fix, in one line; "" when it would admit it. The export's
    own checks: an IR folder's state and inputs, a converted model's architecture against the installed
    optimum-intel and transformers (config.json or the GGUF header)."""
    from ..errors import ExportError

    if source.kind == "bundle":  # exported and checked once already, perhaps by a release without runtime_problem
        from ..export.checks import folder_architecture, runtime_problem
        if not (source.path / "config.json").is_file():
            return ""
        arch = folder_architecture(source.path)
        refusal = runtime_problem(arch.config or {})
        return f"{arch.describe()} {refusal}" if refusal else ""
    if source.kind == "ir":
        from ..export.ir_source import inspect_ir_folder
        try:
            inspect_ir_folder(source.path, role, source.given)
        except ExportError as exc:
            return one_line(str(exc))
        return ""
    from ..export.checks import check_architecture, read_architecture
    arch = read_architecture(source.export_source, role)
    if arch is None:
        return ""  # read once resolved, by the export itself
    try:
        problem = check_architecture(arch, role, source.given)
    except ImportError:
        return ("converting it needs the export extra, which is not installed: pip install 'edge-specdec[export]' "
                "(or pass an OpenVINO IR folder of it)")
    except ExportError as exc:
        return one_line(str(exc))
    if problem is None:
        return ""
    return one_line(f"{problem.arch.describe()} {problem.reason}" + (f" fix: {problem.fix}" if problem.fix
                                                                      else f" {' '.join(problem.why[:1])}"))


def one_line(text: str) -> str:
    """A message on one line (an export error's lines joined)."""
    return re.sub(r"\s*\n\s*", "; ", text.strip())


def look(target: Source, target_vocab: Vocabulary, source: Source, text: str,
         say: Callable[[str], None] = lambda _: None) -> Candidate:
    """The cheap look at one draft: its vocabulary relation, what auto runs with it, its weights, whether the
    export admits it. A vocabulary that cannot be read refuses the candidate (the line says why)."""
    candidate = Candidate(source.name, source, algorithm="auto")
    candidate.weights_bytes, candidate.weights_note = weights(source)
    try:
        vocabulary = relate(target_vocab, read_vocabulary(source), text)
    except EdgeSpecdecError as exc:
        candidate.refused = one_line(str(exc))
        say(f"  {source.name}: {describe_look(candidate)}")
        return candidate
    candidate.relation, candidate.vocabulary = vocabulary["relation"], vocabulary
    candidate.auto = {mode: auto_algorithm(candidate.relation, mode == "greedy", vocabulary["draft_share"])
                      for mode in ("greedy", "sampled")}
    candidate.refused = admission(source) or larger_than_target(source, target)
    say(f"  {source.name}: {describe_look(candidate)}")
    return candidate


def parameters(source: Source) -> Optional[int]:
    """A source's parameters, read from safetensors headers or the GGUF tensor table (None: not known without
    reading the model)."""
    if source.kind == "hf":
        return count_parameters(source.path)
    if source.kind == "gguf":
        try:
            import gguf
        except ImportError:
            return None
        return sum(int(t.n_elements) for t in gguf.GGUFReader(str(source.path)).tensors)
    return None


def larger_than_target(draft: Source, target: Source) -> str:
    """Why a draft about as large as its target, or larger, cannot pay (the export refuses a larger one), read
    from the parameter counts ("" when it is clearly smaller, or when a count is not known without converting)."""
    d, t = parameters(draft), parameters(target)
    if d is None or t is None or d < NOT_SMALLER * t:
        return ""
    return (f"the draft ({d / 1e6:.1f}M parameters) is not smaller than the target ({t / 1e6:.1f}M): a draft must "
            "be a much smaller, faster model; choose a smaller one")


def describe_look(c: Candidate) -> str:
    """The cheap look in words, for the progress lines and the table."""
    if c.refused and not c.vocabulary:
        return f"not usable: {c.refused}"
    v = c.vocabulary
    relation = ("identical vocabulary" if c.relation == "identical" else
                f"another vocabulary: {v['shared_share']:.0%} of the strings spelled the same, "
                f"{v['text_share']:.0%} of the target's text")
    return f"{relation}; {c.weights_bytes / 2**20:.1f} MiB of weights ({c.weights_note})"


def cheap_rank(candidates: list[Candidate]) -> list[Candidate]:
    """The admitted drafts, best first by the cheap look: an identical vocabulary, then the share of the target's
    text the draft spells, then the smaller weights."""
    usable = [c for c in candidates if not c.refused]
    return sorted(usable, key=lambda c: (c.relation != "identical", -c.vocabulary.get("text_share", 0.0),
                                         c.weights_bytes))


def manifest_files(bundle: Path, role: str) -> Optional[dict[str, Any]]:
    """The file records of a bundle's model (role), to tell whether two bundles hold the same target."""
    manifest = json.loads((bundle / MANIFEST_FILE).read_text(encoding="utf-8"))
    return {name: record.get("sha256") for name, record in manifest.get("files", {}).items()
            if name.startswith(f"{role}/")} or None
