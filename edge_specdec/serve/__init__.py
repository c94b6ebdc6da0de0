"""`edge-specdec serve`: an OpenAI-compatible HTTP server on one engine, with a page that shows the drafting.

    from edge_specdec.serve import ServerSettings, create_app
    app = create_app(ServerSettings(bundle="bundles/qwen", slots=2))   # any ASGI server runs it

Needs the `serve` extra (Starlette and uvicorn): pip install "edge-specdec[serve]". `edge_specdec.serve.ray_app`
runs the same app as a Ray Serve deployment with replicas (see docs/serving.md).
"""
from .app import ServerSettings, create_app, uvicorn_config

__all__ = ["ServerSettings", "create_app", "uvicorn_config"]
