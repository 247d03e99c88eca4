"""``minitransformer serve``: one run behind an OpenAI-compatible API and a playground page.

    create_app(run, settings)   the FastAPI app (app.py): /v1/..., /api/..., / and /assets/
    Settings                    the server's limits
    bind, make_server, running  the socket and uvicorn (server.py); running: in a thread

Generation runs on one worker thread behind a request queue (worker.py), never on the event
loop; the decoding loop (sampling.py) is GPT.stream's, with log-probabilities.
"""

from __future__ import annotations

from .app import Settings, create_app
from .server import bind, is_loopback, make_server, running, url_of

__all__ = ["Settings", "bind", "create_app", "is_loopback", "make_server", "running", "url_of"]
