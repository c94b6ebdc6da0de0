"""The errors edge-specdec raises on purpose: each names the problem and the fix."""


class EdgeSpecdecError(Exception):
    """Base class: a user-facing error whose message says what went wrong and what to do."""


class BundleError(EdgeSpecdecError):
    """A bundle folder is missing, incomplete, corrupted or of an unknown version."""


class ExportError(EdgeSpecdecError):
    """An export could not be carried out (bad settings, failed conversion, unwritable output)."""


class SourceError(ExportError):
    """A model source (local folder, hub id, .gguf file) cannot be read."""


class MissingDependencyError(EdgeSpecdecError):
    """An optional dependency (e.g. the export extra) is not installed."""
