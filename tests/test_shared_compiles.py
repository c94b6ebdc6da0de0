"""The test suite's shared compiles (shared_compiles.py): the same graph, device and properties get the model compiled
before; anything else compiles for real."""
from __future__ import annotations

import openvino as ov

from edge_specdec.runtime.session import _prepare_graph
from shared_compiles import REAL_COMPILE, SHARED_MAX_BYTES, CompiledModels, weight_bytes
from support import load_target_xml

CONFIG = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 1}


def paged_target(core: ov.Core, xml) -> ov.Model:
    """The target read from its IR and rewritten as open_model does for a paged session on the CPU."""
    model = core.read_model(str(xml))
    _prepare_graph(model, "paged", "CPU", model.output("logits").get_partial_shape()[-1].get_length(), None, None)
    return model


def reshaped(model: ov.Model, n: int) -> ov.Model:
    """A copy of the model for blocks of n tokens, as graph.compile_for_block makes it."""
    copy = model.clone()
    copy.reshape({name: ov.PartialShape([n]) for name in ("input_ids", "position_ids")})
    return copy


def counting(**options) -> tuple[CompiledModels, list]:
    """A CompiledModels (with these options) and the list of the compiles it ran for real."""
    real = []
    return CompiledModels(lambda core, *args: real.append(args[1:]) or REAL_COMPILE(core, *args), **options), real


def test_two_reads_of_one_model_compile_once_and_static_copies_on_their_own(bundle_dir):
    """Two reads of the target through the same graph surgery differ only in names OpenVINO makes up, and after a
    compile in the names of the nodes it fused: they share one compile. A static copy, another device property or
    the tokenizer (by path) compile on their own; a copy of one size compiles once."""
    xml = load_target_xml(bundle_dir)
    compiles, real = counting()
    core = ov.Core()
    first = compiles(core, paged_target(core, xml), "CPU", CONFIG)
    second_read = paged_target(core, xml)
    assert compiles(core, second_read, "CPU", CONFIG) is first and len(real) == 1
    shared_copy = compiles(core, reshaped(second_read, 3), "CPU", CONFIG)
    assert shared_copy is not first and len(real) == 2
    assert compiles(core, reshaped(paged_target(core, xml), 3), "CPU", CONFIG) is shared_copy and len(real) == 2
    assert shared_copy.input("input_ids").get_partial_shape() == ov.PartialShape([3])
    other = compiles(core, paged_target(core, xml), "CPU", {**CONFIG, "INFERENCE_NUM_THREADS": 2})
    assert other is not first and len(real) == 3
    tokenizer = str(xml.with_name("openvino_tokenizer.xml"))
    assert compiles(core, tokenizer, "CPU") is compiles(core, tokenizer, "CPU") and len(real) == 4


def test_a_cache_folder_a_larger_model_or_a_test_that_compiles_for_real_never_shares(bundle_dir, tmp_path):
    xml = load_target_xml(bundle_dir)
    core = ov.Core()
    model = paged_target(core, xml)
    assert 0 < weight_bytes(model) < SHARED_MAX_BYTES
    compiles, real = counting(max_bytes=weight_bytes(model) - 1)
    assert compiles(core, model, "CPU", CONFIG) is not compiles(core, model, "CPU", CONFIG) and len(real) == 2
    compiles, real = counting()
    cached = {**CONFIG, "CACHE_DIR": str(tmp_path)}
    assert compiles(core, paged_target(core, xml), "CPU", cached) is not compiles(core, paged_target(core, xml),
                                                                                  "CPU", cached)
    compiles.enabled = False
    assert compiles(core, paged_target(core, xml), "CPU", CONFIG) is not compiles(core, paged_target(core, xml),
                                                                                  "CPU", CONFIG)
    assert len(real) == 4


def test_the_least_recently_used_model_is_dropped_past_the_bound(bundle_dir):
    xml = load_target_xml(bundle_dir)
    compiles, real = counting(max_models=2)
    core = ov.Core()
    one, two = (compiles(core, reshaped(paged_target(core, xml), n), "CPU", CONFIG) for n in (1, 2))
    assert compiles(core, reshaped(paged_target(core, xml), 1), "CPU", CONFIG) is one  # now the most recent
    three = compiles(core, reshaped(paged_target(core, xml), 3), "CPU", CONFIG)  # drops two
    assert len(real) == 3 and len(compiles.compiled) == 2
    assert compiles(core, reshaped(paged_target(core, xml), 1), "CPU", CONFIG) is one
    assert compiles(core, reshaped(paged_target(core, xml), 3), "CPU", CONFIG) is three
    assert compiles(core, reshaped(paged_target(core, xml), 2), "CPU", CONFIG) is not two and len(real) == 4
