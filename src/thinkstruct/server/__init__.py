"""The OpenAI-compatible HTTP server (FastAPI + uvicorn) over :mod:`thinkstruct.engine`.

``create_app(engine, settings)`` builds the ASGI app; ``serve(load, settings)`` runs it in
the foreground (``thinkstruct serve``). See ``docs/server.md``.
"""

from thinkstruct.server.app import create_app
from thinkstruct.server.runner import serve
from thinkstruct.server.settings import ServerSettings
from thinkstruct.server.state import ServerState

__all__ = ["ServerSettings", "ServerState", "create_app", "serve"]
