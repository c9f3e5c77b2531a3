"""The gateway's ASGI app: the producer API (/v1), its OpenAPI schema (/openapi.json, docs at
/docs), the HTTP agents' callbacks, a health check, the operator console (/console) and the
agent protocols (A2A at /a2a and /.well-known/agent-card.json, MCP at /mcp: gateway/protocols.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from broker.infra.outages import TRANSIENT_ERRORS
from broker.settings import Settings
from gateway import console, errors, protocols
from gateway.api import callbacks, events, fleet, search, tasks
from gateway.apikeys import AuthMode
from gateway.hot import HotRoutes
from gateway.state import GatewayState, state_of

API_VERSION = "1.0.0"


class GatewayApp(FastAPI):
    """FastAPI, but POST /v1/tasks and GET /v1/tasks/{id}/result are answered before its
    middleware (gateway/hot.py)."""

    hot: HotRoutes | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.hot is None or not await self.hot.answer(scope, receive, send):
            await super().__call__(scope, receive, send)


def create_app(settings: Settings, auth_mode: AuthMode = AuthMode.AUTO) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with protocols.lifespan(running):
            yield
        await console.close(app)
        await state_of(app).close()

    app = GatewayApp(title="Agent-Reach gateway", version=API_VERSION, lifespan=lifespan,
                  description="Reach every agent of the fleet by capability over HTTP: submit tasks, "
                              "wait for their results, follow their events.")
    app.state.gateway = GatewayState(settings, auth_mode)
    errors.install(app)
    console.mount(app)
    for router in (search.router, tasks.router, tasks.batch_router, events.router, fleet.router,
                   callbacks.router):
        app.include_router(router)
    running = protocols.mount(app, app.state.gateway)
    app.hot = HotRoutes(app.state.gateway)

    @app.get("/healthz", tags=["health"], summary="Whether this gateway can reach Redis")
    async def healthz(request: Request) -> JSONResponse:
        try:
            await state_of(request.app).redis.ping()
        except TRANSIENT_ERRORS:
            return JSONResponse({"ok": False, "redis": False}, 503)
        return JSONResponse({"ok": True, "redis": True})

    return app


def openapi_schema(settings: Settings) -> dict[str, Any]:
    """The API's OpenAPI document (as /openapi.json serves it)."""
    return create_app(settings).openapi()
