"""The runtime: loads a bundle and decodes with OpenVINO, openvino-tokenizers and numpy only."""
from .generate import Result, Stats
from .pipeline import ALGORITHMS, Pipeline
from .sampling import GenerationConfig

__all__ = ["ALGORITHMS", "GenerationConfig", "Pipeline", "Result", "Stats"]
