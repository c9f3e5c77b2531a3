"""The console's routes answer HTML, errors included: a route class that turns what a handler
raises into a page (a login redirect, an error page with the status it means) instead of the
API's JSON errors, and gives every answer the console's security headers."""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request
from fastapi.responses import RedirectResponse, Response
from fastapi.routing import APIRoute

from broker.errors import BadInput, BrokerUnavailable, UnknownTask
from broker.infra.outages import TRANSIENT_ERRORS
from gateway.console.access import ConsoleError, LoginNeeded, login_url, viewer_of
from gateway.console.render import finish, page
from gateway.errors import ApiError

log = logging.getLogger("reach.gateway")


def _error_of(exc: Exception) -> ConsoleError | None:
    if isinstance(exc, ConsoleError):
        return exc
    if isinstance(exc, ApiError):
        return ConsoleError(exc.status, exc.message)
    if isinstance(exc, UnknownTask):
        return ConsoleError(404, str(exc))
    if isinstance(exc, BadInput):
        return ConsoleError(400, str(exc))
    if isinstance(exc, (BrokerUnavailable, *TRANSIENT_ERRORS)):
        return ConsoleError(503, "Redis cannot be reached; try again shortly.")
    return None


class ConsoleRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def run(request: Request) -> Response:
            try:
                response = await handler(request)
            except LoginNeeded as exc:
                return finish(request, RedirectResponse(login_url(exc.next_url), 303), None)
            except Exception as exc:
                error = _error_of(exc)
                if error is None:
                    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
                    error = ConsoleError(500, "Internal error (the gateway logged it).")
                viewer = getattr(request.state, "console_viewer", None)
                return finish(request, page(request, viewer, "error.html", error.status,
                                            message=error.message), viewer)
            return finish(request, response, await viewer_of(request))

        return run
