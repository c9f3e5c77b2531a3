"""The HTTP face of Reach (`reach serve`): producers in any language submit tasks, wait for
their results and follow their events over HTTP; HTTP agents post their callbacks here.

    app        the ASGI app (FastAPI): gateway.app.create_app(settings, auth_mode)
    server     serving it with uvicorn, where it listens, who may call it
    api/       the routes of API v1 (tasks, events, fleet, callbacks)
    apikeys    API keys and their roles (`reach keys`); when a key is needed (AuthMode)
    auth       checking a request's key
    follow     a task's events for Server-Sent Events, from any point
    errors     errors as JSON with the status users expect
    console/   the operator console at /console (HTML pages, live over SSE)

(This module imports nothing heavy: `reach keys` needs no web framework.)
"""

from gateway.apikeys import AuthMode, Role

__all__ = ["AuthMode", "Role"]
