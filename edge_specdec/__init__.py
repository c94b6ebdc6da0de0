"""edge-specdec: lossless speculative decoding on OpenVINO, with drafts of any vocabulary.

    from edge_specdec import Pipeline, GenerationConfig
    pipe = Pipeline()                                   # the packaged demo; or Pipeline("bundles/qwen")
    print(pipe.generate("def fib(n):", GenerationConfig(max_new_tokens=64)).text)
"""
__version__ = "0.1.0"

from .bundle import Bundle, load_bundle  # noqa: E402
from .errors import BundleError, EdgeSpecdecError, ExportError  # noqa: E402

# the runtime's front door, imported when first used: `edge_specdec.cli` and the export stage need no OpenVINO
# runtime loaded to start
_RUNTIME = ("Conversation", "DecodingSession", "Engine", "EngineConfig", "GenerationConfig", "Pipeline", "Result",
            "SpeculativeConfig")


def __getattr__(name: str):
    if name in _RUNTIME:
        from . import runtime
        return getattr(runtime, name)
    raise AttributeError(f"module 'edge_specdec' has no attribute {name!r}")


__all__ = ["__version__", "Bundle", "load_bundle", "BundleError", "EdgeSpecdecError", "ExportError", *_RUNTIME]
