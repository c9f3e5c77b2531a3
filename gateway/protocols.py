"""The agent protocols on the gateway's app: A2A (gateway/a2a) and MCP (gateway/mcp), each
mounted when its extra is installed. Without it, its endpoints answer 501 with the command
that installs it, so a client learns what is missing rather than meeting a bare 404.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Protocol

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gateway.errors import error_body
from gateway.state import GatewayState

log = logging.getLogger("reach.gateway")


class Running(Protocol):
    def running(self) -> AbstractAsyncContextManager[None]:
        """What runs while the app serves."""

A2A_PATHS = ("/.well-known/agent-card.json", "/a2a", "/a2a/{rest:path}")
MCP_PATHS = ("/mcp",)


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _missing(extra: str, what: str, paths: tuple[str, ...]) -> list[Route]:
    async def endpoint(request: Request) -> JSONResponse:
        return JSONResponse(error_body("not_installed", f"{what} needs the {extra} extra: "
                                       f"pip install 'agent-reach[{extra}]'"), 501)

    return [Route(path, endpoint, methods=["GET", "POST", "DELETE"]) for path in paths]


def mount(app: FastAPI, gw: GatewayState) -> list[Running]:
    """Add the protocol endpoints to `app`; returns what needs running while it serves (see
    lifespan)."""
    running: list[Running] = []
    if installed("a2a") and installed("jsonschema"):
        from gateway.a2a.routes import a2a_routes

        app.router.routes.extend(a2a_routes(gw))
    else:
        app.router.routes.extend(_missing("a2a", "A2A", A2A_PATHS))
    if installed("mcp"):
        from gateway.mcp.http import mcp_app

        mounted = mcp_app(gw)
        app.router.routes.extend(mounted.routes)
        running.append(mounted)
    else:
        app.router.routes.extend(_missing("mcp", "MCP", MCP_PATHS))
    return running


@asynccontextmanager
async def lifespan(running: list[Running]) -> AsyncIterator[None]:
    """Run what the mounted protocols need while the app serves (MCP's session manager)."""
    async with AsyncExitStack() as stack:
        for item in running:
            await stack.enter_async_context(item.running())
        yield
