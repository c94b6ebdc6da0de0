"""The runtime: loads a bundle and decodes with OpenVINO, openvino-tokenizers and numpy only."""
from .algorithms import ALGORITHMS
from .conversation import Conversation
from .generate import PrefillProgress, Result, Stats
from . import npu  # noqa: F401  (adds the NPU's rollback, npuw, to session.open_model)
from .pipeline import DecodingSession, Engine, Pipeline
from .sampling import GenerationConfig
from .settings import EngineConfig, SpeculativeConfig

__all__ = ["ALGORITHMS", "Conversation", "DecodingSession", "Engine", "EngineConfig", "GenerationConfig", "Pipeline",
           "PrefillProgress", "Result", "SpeculativeConfig", "Stats"]
