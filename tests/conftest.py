"""Session-scoped fixtures: tiny tokenizers, tiny models and exported bundles, each built once per run."""
from __future__ import annotations

import gc
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "models"))
from shared_compiles import CompiledModels  # noqa: E402  (before any test patches OpenVINO)
from tiny_pair import build_model, train_tokenizer  # noqa: E402

# Tokenizer styles and their vocabulary sizes.
TOKENIZERS = {"bytelevel": 700, "metaspace": 600, "prefixspace": 500}
# name: (architecture, tokenizer style, hidden size, seed)
MODELS = {
    "qwen2-bytelevel": ("qwen2", "bytelevel", 64, 0),          # the target of every tiny pair
    "qwen2-bytelevel-small": ("qwen2", "bytelevel", 32, 1),    # same-vocabulary draft
    "llama-metaspace": ("llama", "metaspace", 32, 2),          # Llama-2 style tokenizer draft
    "gpt2-prefixspace": ("gpt2", "prefixspace", 32, 3),        # prefix-space tokenizer draft
    "llama-metaspace-large": ("llama", "metaspace", 64, 4),    # targets of the other tokenizer styles
    "gpt2-prefixspace-large": ("gpt2", "prefixspace", 64, 5),
    "qwen2-bytelevel-padded": ("qwen2", "bytelevel", 32, 6, 4),  # same-vocabulary draft with 4 more logits
}


@pytest.fixture(scope="session", autouse=True)
def _offline():
    """The suite never touches a model hub."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("EDGE_SPECDEC_CACHE_DIR", "off")  # tests that use the compiled-model cache say so


# What an engine measures of its models (measurements.py) that the tests may share: the exactness probes' verdicts
# and the block-size choices (the longest exact call among them). Not the drafting guard's verdicts (a run's
# history, which tests start without) nor the draft device's timings.
SHARED_MEASUREMENTS = (r"target/(invariant|sequences|longest_block|batch_invariant|static_invariant/.*)"
                       r"|(target|draft)/(fixed_block/\d+|step)")
_shared_plans: dict[str, dict] = {}  # MeasurementCache.digest -> the shared measurements of that key
_sharing = [False]  # whether the running test shares them (see _share_measurements)


@pytest.fixture(scope="session", autouse=True)
def _measure_each_plan_once():
    """With the measurement cache off (as in these tests), every Engine probes its target's block invariance and
    times its block sizes again, though another engine of the same bundle and settings did already. This keeps those
    measurements in this process under the measurement cache's own key (MeasurementCache.digest: the bundle's
    files, OpenVINO, the machine, the placement and the settings), so that an engine of the same key made by a
    later test reads them as if from the cache: measured once per worker and key, as a cache file would be.

    A test that uses monkeypatch neither reads nor adds to them: it may patch a probe or the models, so its engines
    measure for themselves, as every engine did before (see _share_measurements). Engines with a cache folder
    (the tests of the cache itself) keep using their own files."""
    import re

    from edge_specdec.runtime.measurements import MeasurementCache

    real_init, real_save = MeasurementCache.__init__, MeasurementCache.save

    def init(self, cache_dir, key):
        real_init(self, cache_dir, key)
        self.shared = cache_dir is None and _sharing[0]
        if self.shared:
            self.values.update(_shared_plans.get(self.digest, {}))

    def save(self):
        if getattr(self, "shared", False) and _sharing[0]:  # not what an engine measures under a later test's patches
            plan = _shared_plans.setdefault(self.digest, {})
            plan.update((name, value) for name, value in self.values.items()
                        if re.fullmatch(SHARED_MEASUREMENTS, name))
        real_save(self)

    mp = pytest.MonkeyPatch()
    mp.setattr(MeasurementCache, "__init__", init)
    mp.setattr(MeasurementCache, "save", save)
    yield
    mp.undo()


_compiles: list = [None]  # the CompiledModels of _compile_each_model_once


@pytest.fixture(scope="session", autouse=True)
def _compile_each_model_once():
    """Engines of the same tiny bundle and settings, opened by many tests, compile the same graphs again: the
    target, the draft, their static copies, the tokenizers. This hands out a model compiled earlier in this process
    for the same graph (its serialized bytes), device and properties, as one Engine shares its compiled models
    among its sessions (see shared_compiles.py for what the key holds). Tests that use monkeypatch compile for real
    (they may count, patch or time compiles), as do compiles with OpenVINO's cache folder; sessions still get their
    own infer requests. EDGE_SPECDEC_TEST_SHARED_COMPILES=0 turns it off (every compile for real)."""
    import openvino as ov

    if os.environ.get("EDGE_SPECDEC_TEST_SHARED_COMPILES", "1") == "0":
        yield
        return
    compiles = _compiles[0] = CompiledModels()
    mp = pytest.MonkeyPatch()
    mp.setattr(ov.Core, "compile_model", lambda core, *args, **kwargs: compiles(core, *args, **kwargs))
    yield
    mp.undo()
    _compiles[0] = None


@pytest.fixture(autouse=True)
def _share_measurements(request):
    """The running test shares the measured plans of _measure_each_plan_once, and the compiled models of
    _compile_each_model_once, unless it uses monkeypatch."""
    _sharing[0] = "monkeypatch" not in request.fixturenames
    if _compiles[0] is not None:
        _compiles[0].enabled = _sharing[0]
    yield
    _sharing[0] = False
    if _compiles[0] is not None:
        _compiles[0].enabled = True


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session")
def shared_dir(tmp_path_factory) -> Path:
    """A folder that every pytest-xdist worker of this run shares (the run's base temp), else this session's."""
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "tiny-shared"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def built_once(folder: Path, build) -> Path:
    """build() writes `folder` and returns its path; run it once per test run, whichever worker asks first (a file
    lock: the others wait for it, then take the same files). A build that failed is retried by the next caller."""
    from filelock import FileLock

    done = folder.with_name(folder.name + ".done")
    with FileLock(str(folder) + ".lock"):
        if not done.exists():
            if folder.exists():
                shutil.rmtree(folder)  # a build that raised half-way
            done.write_text(str(build()))
        return Path(done.read_text())


def _source_key(source) -> tuple:
    """A source folder as a cache key: its path and every file's name, size and mtime (an edited copy misses)."""
    folder = Path(source).resolve()
    return (str(folder),) + tuple((p.relative_to(folder).as_posix(), p.stat().st_size, p.stat().st_mtime_ns)
                                  for p in sorted(folder.rglob("*")) if p.is_file())


@pytest.fixture(scope="session", autouse=True)
def _convert_each_model_once(tmp_path_factory, shared_dir):
    """Every in-process export converts a given (model folder, weight settings) once per test run, then copies it.

    The tiny models are exported into many bundles (a target in most of them, each weight format); optimum-intel's
    torch trace and NNCF's compression cost seconds each and give the same files every time. Both steps of
    export_model are memoized in a folder the pytest-xdist workers share (built_once): optimum-intel's
    full-precision IR per source folder, and export_model's output per (source, settings). The first conversion of
    each runs for real and is what the export tests check; exports in a subprocess (the CLI's own tests,
    optimum-cli) are not affected."""
    import hashlib
    import json

    from edge_specdec import export as export_pkg
    from edge_specdec.export import convert

    root = tmp_path_factory.mktemp("converted")  # this worker's scratch folders
    shared = shared_dir / "converted"
    shared.mkdir(exist_ok=True)
    frozen: list[bool] = []

    def memo_folder(kind: str, key: tuple) -> Path:
        return shared / f"{kind}-{hashlib.sha256(repr(key).encode()).hexdigest()[:16]}"

    real_export_model, real_import_optimum = convert.export_model, convert.import_optimum

    def import_optimum():
        main_export, *rest = real_import_optimum()
        if not frozen:
            # optimum-intel calls gc.collect() several times a conversion, each a walk over every object in the
            # process, most of them torch's and transformers' modules; frozen once they are imported (what is
            # alive now stays), a conversion's collections walk only what came after
            gc.collect()
            gc.freeze()
            frozen.append(True)

        def cached_main_export(source, out, **kwargs):
            dtype = getattr(kwargs.get("ov_config"), "dtype", None)
            key = _source_key(source) + (repr(sorted((k, v) for k, v in kwargs.items() if k != "ov_config")), dtype)
            folder = memo_folder("full", key)
            built_once(folder, lambda: main_export(source, folder, **kwargs) or folder)
            shutil.copytree(folder, out, dirs_exist_ok=True)
        return (cached_main_export, *rest)

    def export_model(source, out, settings, scratch, progress):
        folder = memo_folder("model", _source_key(source) + (repr(settings),))
        stats = folder.with_name(folder.name + ".stats.json")

        def build() -> Path:
            stats.write_text(json.dumps(real_export_model(source, folder, settings,
                                                          Path(tempfile.mkdtemp(dir=root)), progress)))
            return folder
        built_once(folder, build)
        Path(out).mkdir(parents=True, exist_ok=True)
        shutil.copytree(folder, out, dirs_exist_ok=True)
        return json.loads(stats.read_text())

    mp = pytest.MonkeyPatch()
    mp.setattr(convert, "import_optimum", import_optimum)
    mp.setattr(export_pkg, "export_model", export_model)
    yield
    mp.undo()


@pytest.fixture(scope="session")
def tokenizer_dir(shared_dir):
    cache: dict[str, Path] = {}

    def get(style: str) -> Path:
        if style not in cache:
            out = shared_dir / f"tok-{style}"
            cache[style] = built_once(out, lambda: train_tokenizer(style, TOKENIZERS[style], out))
        return cache[style]
    return get


@pytest.fixture(scope="session")
def model_dir(shared_dir, tokenizer_dir):
    cache: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in cache:
            arch, style, hidden, seed, *pad = MODELS[name]
            tokenizer, out = tokenizer_dir(style), shared_dir / f"model-{name}"
            cache[name] = built_once(out, lambda: build_model(arch, tokenizer, out, seed=seed, hidden=hidden,
                                                              vocab_pad=pad[0] if pad else 0))
        return cache[name]
    return get


@pytest.fixture(scope="session")
def bundle_dir(shared_dir, model_dir):
    """bundle_dir(target, draft, target_format, draft_format) -> an exported bundle, exported once per run (the
    workers of pytest-xdist share it: tests copy a bundle before they change it)."""
    from edge_specdec.export import WeightSettings, export_bundle

    cache: dict[tuple, Path] = {}

    def get(target: str, draft: str | None, target_format: str = "int4", draft_format: str = "int8") -> Path:
        key = (target, draft, target_format, draft_format)
        if key not in cache:
            out = shared_dir / "bundles" / "__".join(str(k) for k in key)
            out.parent.mkdir(exist_ok=True)
            target_dir, draft_dir = str(model_dir(target)), str(model_dir(draft)) if draft else None
            cache[key] = built_once(out, lambda: export_bundle(target_dir, draft_dir, out,
                                                               target_weights=WeightSettings(target_format),
                                                               draft_weights=WeightSettings(draft_format)))
        return cache[key]
    return get


@pytest.fixture(scope="module")
def cache_off_pipes(bundle_dir):
    """cache_off_pipes(pair): one Pipeline per pair of tiny models for the module, without the compiled-model cache."""
    from edge_specdec.runtime import Pipeline

    cache: dict = {}

    def get(pair):
        if pair not in cache:
            cache[pair] = Pipeline(bundle_dir(*pair), cache_dir="off")
        return cache[pair]
    return get
