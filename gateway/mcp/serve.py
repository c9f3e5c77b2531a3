"""`reach mcp`: the MCP server on its own, over stdio (what desktop MCP hosts start) or
streamable HTTP (as the gateway mounts it, at <URL>/mcp, behind the same API keys).

Over stdio, stdout is the protocol's: everything else (logs) goes to stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import uvicorn
from mcp.server.stdio import stdio_server
from starlette.applications import Starlette

from broker.settings import Settings
from gateway.addresses import parse_addr
from gateway.apikeys import AuthMode
from gateway.mcp.http import McpMount
from gateway.mcp.server import ReachMcp
from gateway.server import auth_mode, bind, url_of
from gateway.state import GatewayState


async def serve_stdio(settings: Settings) -> None:
    """Serve one MCP client on stdin/stdout until it closes them."""
    gw = GatewayState(settings, AuthMode.OFF)  # (the process that started this one is the client)
    mcp = ReachMcp(gw)
    watcher = asyncio.create_task(mcp.watch(), name="mcp-tool-watcher")
    try:
        async with stdio_server() as (read, write):
            await mcp.server.run(read, write, mcp.server.create_initialization_options())
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        await gw.close()


def http_app(settings: Settings, mode: AuthMode) -> Starlette:
    gw = GatewayState(settings, mode)
    mount = McpMount(gw)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with mount.running():
            yield
        await gw.close()

    return Starlette(routes=mount.routes, lifespan=lifespan)


def serve_http(settings: Settings, addr: str, *, insecure_no_auth: bool = False, log_level: str = "info",
               url_file: Path | None = None) -> None:
    """Serve MCP over streamable HTTP at <URL>/mcp until SIGINT/SIGTERM."""
    host, port = parse_addr(addr)
    mode = auth_mode(settings, host, insecure_no_auth)
    sock = bind(host, port)
    url = url_of(sock)
    server = uvicorn.Server(uvicorn.Config(http_app(settings, mode), log_level=log_level, access_log=False,
                                           lifespan="on", timeout_graceful_shutdown=5))
    print(f"reach MCP server listening on {url}/mcp (API keys: {mode.value})", flush=True)
    if url_file is not None:
        url_file.write_text(url + "\n")
    server.run(sockets=[sock])
