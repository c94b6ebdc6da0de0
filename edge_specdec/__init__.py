"""edge-specdec: lossless speculative decoding on OpenVINO, with drafts of any vocabulary."""
__version__ = "0.1.0"

from .bundle import Bundle, load_bundle  # noqa: E402
from .errors import BundleError, EdgeSpecdecError, ExportError  # noqa: E402

__all__ = ["__version__", "Bundle", "load_bundle", "BundleError", "EdgeSpecdecError", "ExportError"]
