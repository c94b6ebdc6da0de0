"""Device placement against faked device lists, each device's compile properties, CPU threads for small models,
and the compiled-model cache on this machine."""
from __future__ import annotations

import os

import pytest

from edge_specdec.errors import EdgeSpecdecError
from edge_specdec.runtime import Pipeline
from edge_specdec.runtime.devices import DeviceError, DeviceInfo, compile_config, place
from support import SAME_VOCAB

CPU = DeviceInfo("CPU")
IGPU = DeviceInfo("GPU.0", "integrated")
DGPU = DeviceInfo("GPU.1", "discrete")
NPU = DeviceInfo("NPU")


@pytest.mark.parametrize("devices,target,draft", [
    ([CPU], "CPU", "CPU"),                          # this machine
    ([CPU, IGPU], "CPU", "GPU.0"),                  # a laptop: the draft on the iGPU
    ([CPU, NPU], "CPU", "NPU"),                     # an AI PC without a usable iGPU
    ([CPU, IGPU, NPU], "CPU", "GPU.0"),             # the iGPU first, then the NPU
    ([CPU, DGPU], "GPU.1", "CPU"),                  # a discrete GPU takes the target
    ([CPU, IGPU, DGPU], "GPU.1", "GPU.0"),
])
def test_automatic_placement_follows_the_design(devices, target, draft):
    placement = place(devices, "AUTO", "AUTO")
    assert (placement.target, placement.draft) == (target, draft)
    assert placement.describe().startswith(f"target on {target}, draft on {draft} (")


def test_explicit_devices_are_honoured_and_named_exactly():
    assert (place([CPU, IGPU, NPU], "CPU", "NPU").draft) == "NPU"
    assert place([CPU, DeviceInfo("GPU", "integrated")], "CPU", "GPU.0").draft == "GPU"  # a lone GPU is "GPU"
    assert place([CPU, IGPU, DGPU], "gpu", "cpu").target == "GPU.0"  # case-insensitive; GPU = the first GPU
    assert place([CPU], "CPU", None).draft is None  # a target-only bundle


def test_absent_device_is_an_error_unless_fallback_is_allowed():
    with pytest.raises(DeviceError, match=r"NPU was asked for the draft, but this machine has only: CPU.*--allow-fallback"):
        place([CPU], "CPU", "NPU")
    placement = place([CPU], "GPU.1", "NPU", allow_fallback=True)
    assert (placement.target, placement.draft) == ("CPU", "CPU")
    assert "target: GPU.1 not found, fell back to CPU" in placement.describe()


@pytest.mark.parametrize("bad", ["TPU", "GPU.x", "CUDA:0", ""])
def test_unknown_device_names_are_refused(bad):
    with pytest.raises(DeviceError, match="unknown device"):
        place([CPU], bad, "CPU")


def test_device_configs(tmp_path):
    assert compile_config("GPU", None)["KV_CACHE_PRECISION"] == "f16"  # a GPU's per-block int8 cache is not exact
    assert "NPUW_LLM" not in compile_config("NPU", None)  # NPUW's properties depend on the model (test_npu.py)
    assert compile_config("GPU.0", tmp_path)["CACHE_DIR"] == str(tmp_path)
    assert compile_config("CPU", None, threads=1)["INFERENCE_NUM_THREADS"] == 1


def test_small_models_get_one_cpu_thread_unless_told(bundle_dir, monkeypatch):
    def threads(pipe):
        return [s.compiled.get_property("INFERENCE_NUM_THREADS") for s in (pipe.target, pipe.draft)]
    bundle = bundle_dir(*SAME_VOCAB)
    # no static copies: the threads are the models' own, and their copies would only be compiled for nothing
    assert threads(Pipeline(bundle, cache_dir="off", static_shapes=False)) == [1, 1]  # tiny: far under 32 MB
    assert threads(Pipeline(bundle, cache_dir="off", static_shapes=False, threads=2)) == [2, 2]
    monkeypatch.setattr("edge_specdec.runtime.pipeline.SMALL_MODEL_BYTES", 0)  # as if both were big
    if (os.cpu_count() or 1) > 1:
        assert 1 not in threads(Pipeline(bundle, cache_dir="off", static_shapes=False))
    with pytest.raises(EdgeSpecdecError, match="threads must be at least 1"):
        Pipeline(bundle, threads=0)


def test_this_machine_runs_auto_on_the_cpu_and_caches_compiled_models(bundle_dir, tmp_path):
    pipe = Pipeline(bundle_dir(*SAME_VOCAB), cache_dir=tmp_path / "cache")
    assert (pipe.placement.target, pipe.placement.draft) == ("CPU", "CPU") and not pipe.concurrent
    assert any((tmp_path / "cache").iterdir())
    with pytest.raises(DeviceError, match="this machine has only"):
        Pipeline(bundle_dir(*SAME_VOCAB), draft_device="NPU")
