"""The MCP server (`mcp` SDK's low-level Server): every live capability a tool; a call submits a
task, reports its progress events as MCP progress notifications, and answers its result (a tool
error with Reach's reason when it fails). A call the client cancels cancels the task.

Tools come and go with the agents: ToolWatcher reads the catalog again whenever the registry
records a change (and every WATCH_S regardless) and, when the tools differ, tells the clients:
on `subscriptions/listen` streams (protocol 2026-07-28) and, for clients of the handshake era,
with `notifications/tools/list_changed` on their sessions.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
from typing import Any

import anyio
import mcp_types as types
from mcp.server import NotificationOptions, Server, ServerRequestContext
from mcp.server.context import CallNext, HandlerResult
from mcp.server.models import InitializationOptions
from mcp.server.session import ServerSession
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from broker.errors import BadInput, QueueFull
from broker.infra import outages
from broker.keys import RegistryKeys
from broker.ops.catalog import CapabilityRow
from broker.protocol.submit import SubmitOptions
from gateway.capabilities import Capabilities, SchemaError
from gateway.follow import follow
from gateway.mcp import tools
from gateway.mcp.progress import ProgressReport
from gateway.state import GatewayState

log = logging.getLogger("reach.gateway")

WATCH_S = 5.0
"""The tools are compared this often even when the registry records nothing (an agent that
went offline is judged by the clock)."""
MAX_SESSIONS = 1024


class ReachServer(Server[Any]):
    """The SDK's server, announcing that its tool list changes."""

    def create_initialization_options(self, notification_options: NotificationOptions | None = None,
                                      experimental_capabilities: dict[str, dict[str, Any]] | None = None,
                                      extensions: dict[str, dict[str, Any]] | None = None
                                      ) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True), experimental_capabilities,
            extensions)


class ReachMcp:
    def __init__(self, gw: GatewayState) -> None:
        self.gw = gw
        self.capabilities = Capabilities(gw)
        self.bus = InMemorySubscriptionBus()
        self.sessions: collections.deque[ServerSession] = collections.deque(maxlen=MAX_SESSIONS)
        """The handshake-era clients' sessions (tools/list_changed goes to each)."""
        self.server = ReachServer("agent-reach", version="0.1.0", title="Agent-Reach",
                                  instructions="Every tool is an agent of a Reach fleet: a call runs a task "
                                               "on it (queued, routed, retried) and answers its result.",
                                  on_list_tools=self.list_tools, on_call_tool=self.call_tool,
                                  on_subscriptions_listen=ListenHandler(self.bus))
        self.server.middleware.append(self._track_sessions)

    # -- tools ------------------------------------------------------------------------------

    async def list_tools(self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                         ) -> types.ListToolsResult:
        rows = await self.capabilities.live()
        return types.ListToolsResult(tools=[tools.tool(r) for r in rows])

    async def call_tool(self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
                        ) -> types.CallToolResult:
        row = await self.capabilities.find(params.name)
        if row is None:
            raise MCPError(INVALID_PARAMS, f"unknown tool {params.name!r}: no live agent serves it")
        payload = tools.payload_of(row, params.arguments)
        try:
            self.capabilities.check(row, payload)
            options = SubmitOptions(metadata={"mcp": True})
            handle = await self.gw.client.submit(row.capability, payload, options)
        except SchemaError as exc:
            return tools.failure(f"invalid arguments for {row.capability}: {exc}")
        except (BadInput, QueueFull) as exc:
            return tools.failure(f"{type(exc).__name__}: {exc}")
        return await self._outcome(ctx, row, handle.task_id)

    async def _outcome(self, ctx: ServerRequestContext[Any], row: CapabilityRow, task_id: str
                       ) -> types.CallToolResult:
        gw, ended = self.gw, False
        report = ProgressReport(ctx.session)
        try:
            async for event in follow(gw.settings, gw.scripts, gw.listener, task_id, 0, gw.stream_reads):
                if event.type == "progress":
                    await report.event(event.data)
            outcome = await gw.results.read(task_id)
            ended = outcome.ended
        finally:
            if not ended:  # (the client canceled the call, or went away: the task goes too)
                with anyio.CancelScope(shield=True):
                    await self._cancel(task_id)
        if outcome.state == "succeeded":
            return tools.success(row, outcome.result)
        text = f"{outcome.reason or outcome.state}: {outcome.error}" if outcome.error else (
            outcome.reason or outcome.state)
        return tools.failure(f"task {task_id} {outcome.state}: {text}")

    async def _cancel(self, task_id: str) -> None:
        try:
            await self.gw.client.cancel(task_id)
        except Exception as exc:  # (best effort: the call is over either way)
            log.warning("could not cancel task %s after its MCP call ended: %s", task_id, exc)

    # -- telling the clients of changes -----------------------------------------------------

    async def _track_sessions(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext
                              ) -> HandlerResult:
        modern = ctx.session.protocol_version in MODERN_PROTOCOL_VERSIONS
        if ctx.method == "notifications/initialized" and not modern:
            self.sessions.append(ctx.session)
        return await call_next(ctx)

    async def tools_changed(self) -> None:
        await self.bus.publish(ToolsListChanged())
        for session in list(self.sessions):
            try:
                await session.send_tool_list_changed()
            except Exception:  # (a client gone: forget it)
                with contextlib.suppress(ValueError):
                    self.sessions.remove(session)

    async def watch(self) -> None:
        """Tell the clients whenever the tools change, until cancelled."""
        seen = _signature(await self._live())
        events = RegistryKeys(self.gw.settings.prefix).events
        last = "$"
        while True:
            try:
                reply: Any = await self.gw.redis.xread({events: last}, count=100, block=round(WATCH_S * 1000))
                if reply:
                    last = reply[-1][1][-1][0]
                now = _signature(await self._live())
            except outages.TRANSIENT_ERRORS as exc:
                log.warning("cannot read the registry for tool changes: %s", exc)
                await asyncio.sleep(1.0)
                continue
            if now != seen:
                seen = now
                await self.tools_changed()

    async def _live(self) -> list[CapabilityRow]:
        return await self.capabilities.live(fresh=True)


def _signature(rows: list[CapabilityRow]) -> tuple[tuple[str, str], ...]:
    return tuple((r.capability, json.dumps(tools.tool(r).model_dump(mode="json"), sort_keys=True))
                 for r in rows)
