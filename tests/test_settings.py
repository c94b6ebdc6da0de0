"""EngineConfig and SpeculativeConfig: checked once when built, one line that names the field, and the one way
keyword arguments become them."""
import pytest

from edge_specdec.errors import EdgeSpecdecError
from edge_specdec.runtime import EngineConfig, SpeculativeConfig
from edge_specdec.runtime.algorithms import CONFIDENCE, REGISTRY
from edge_specdec.runtime.settings import generate_configs


@pytest.mark.parametrize("field, value", [
    ("draft_vocab", -1), ("threads", 0), ("precision", "f16"), ("kv_rollback", "undo"), ("crowded_draft_tokens", -1),
    ("draft_max_sessions", 0), ("batch_wait", float("nan")), ("npu_max_prompt", 0), ("target_device", ""),
    ("batching", "yes"), ("concurrent", 1), ("draft_vocab", 1.5)])
def test_a_wrong_engine_setting_is_one_line_that_names_it(field, value):
    with pytest.raises(EdgeSpecdecError, match=rf"^{field} must be .*, not ") as refused:
        EngineConfig(**{field: value})
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("field, value", [
    ("algorithm", "magic"), ("num_assistant_tokens", 0), ("num_assistant_tokens", True), ("draft_policy", "fast"),
    ("confidence", 1.0), ("confidence", -0.1), ("confidence", float("nan")), ("lookup", None), ("guard", "on")])
def test_a_wrong_speculative_setting_is_one_line_that_names_it(field, value):
    with pytest.raises(EdgeSpecdecError, match=rf"^{field} must be .*, not ") as refused:
        SpeculativeConfig(**{field: value})
    assert "\n" not in str(refused.value)


def test_configs_are_frozen_and_keyword_arguments_become_them_in_one_place():
    with pytest.raises(AttributeError):
        EngineConfig().threads = 2
    assert EngineConfig.of(None, {"threads": 2}) == EngineConfig(threads=2)
    given = SpeculativeConfig(algorithm="slem")
    assert generate_configs(None, given, {}) == (None, given) and generate_configs(None, given, {})[1] is given
    config, speculative = generate_configs(None, None, {"max_new_tokens": 8, "algorithm": "tli"})
    assert config.fields_set == {"max_new_tokens"} and speculative == SpeculativeConfig(algorithm="tli")
    with pytest.raises(EdgeSpecdecError, match="not both"):
        EngineConfig.of(EngineConfig(), {"threads": 2})
    with pytest.raises(TypeError, match="unknown Engine setting 'verify'"):
        EngineConfig.of(None, {"verify": False})
    with pytest.raises(TypeError, match="unknown generate"):
        generate_configs(None, None, {"k": 3})
    assert generate_configs(None, given, {"num_assistant_tokens": 3})[1] == SpeculativeConfig(algorithm="slem",
                                                                                           num_assistant_tokens=3)


def test_the_defaults_of_a_request_are_the_algorithms():
    default = SpeculativeConfig()
    assert default.draft_tokens(REGISTRY["slem"]) == REGISTRY["slem"].draft_tokens
    assert default.draft_tokens(REGISTRY["prompt-lookup"]) == REGISTRY["prompt-lookup"].draft_tokens
    assert default.confidence_stop() == CONFIDENCE
    assert SpeculativeConfig(num_assistant_tokens=3, confidence=0).draft_tokens(REGISTRY["slem"]) == 3
    assert SpeculativeConfig(confidence=0).confidence_stop() == 0
