"""MCP over streamable HTTP at /mcp: on the gateway's app (behind its API keys: listing needs a
reader key, calling a tool a producer key), and served alone by `reach mcp --transport http`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.routing import BaseRoute, Route

from gateway.apikeys import AuthMode, Role
from gateway.guard import Guard, jsonrpc_methods
from gateway.jsonbody import DEFAULT_BODY_LIMIT
from gateway.mcp.server import ReachMcp
from gateway.state import GatewayState

PATH = "/mcp"


def mcp_role(method: str, path: str, body: Any) -> Role:
    return Role.PRODUCER if "tools/call" in jsonrpc_methods(body) else Role.READER


class McpMount:
    """The /mcp route, and what must run while the app serves (the SDK's session manager, the
    watcher of tool changes)."""

    def __init__(self, gw: GatewayState) -> None:
        self.mcp = ReachMcp(gw)
        self.manager = StreamableHTTPSessionManager(app=self.mcp.server, security_settings=_security(gw))
        limit = gw.settings.max_payload_bytes + DEFAULT_BODY_LIMIT
        self.routes: list[BaseRoute] = [
            Route(PATH, Guard(StreamableHTTPASGIApp(self.manager), gw, mcp_role, limit),
                  methods=["GET", "POST", "DELETE"])]

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with self.manager.run():
            watcher = asyncio.create_task(self.mcp.watch(), name="mcp-tool-watcher")
            try:
                yield
            finally:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher


def _security(gw: GatewayState) -> TransportSecuritySettings:
    """On a loopback address (where keys may be absent) only local Host and Origin headers are
    accepted, so that a web page cannot reach the tools through DNS rebinding; elsewhere the API
    keys guard the endpoint."""
    if gw.auth.mode is not AuthMode.AUTO:
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    hosts = ["127.0.0.1", "localhost", "[::1]"]
    return TransportSecuritySettings(enable_dns_rebinding_protection=True,
                                     allowed_hosts=[f"{h}:*" for h in hosts],
                                     allowed_origins=[f"http://{h}:*" for h in hosts])


def mcp_app(gw: GatewayState) -> McpMount:
    return McpMount(gw)
