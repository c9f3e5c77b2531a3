"""The A2A endpoints on the gateway's app, made of a2a-sdk's JSON-RPC and HTTP+JSON dispatchers
over ReachRequestHandler, each behind the gateway's API keys (gateway/guard.py):

    GET  /.well-known/agent-card.json, /a2a/.well-known/agent-card.json   the fleet's card
    POST /a2a                                   JSON-RPC (the skill in the message's metadata)
         /a2a/rest/...                          HTTP+JSON (message:send, tasks/{id}, ...)
    GET  /a2a/agents/<capability>/.well-known/agent-card.json              one capability's card
    POST /a2a/agents/<capability>               JSON-RPC, that capability's skill
         /a2a/agents/<capability>/rest/...      HTTP+JSON

Reads need a reader key; sending and canceling a producer key.
"""

from __future__ import annotations

import time
from typing import Any

from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes import DefaultServerCallContextBuilder, create_rest_routes
from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route, Router

from broker.ids import CAPABILITY_RE
from gateway.a2a.cards import AGENTS_PATH, FLEET_PATH, REST_SUFFIX, capability_card, fleet_card
from gateway.a2a.handler import ReachRequestHandler
from gateway.apikeys import AuthMode, Role
from gateway.capabilities import Capabilities
from gateway.errors import error_body
from gateway.guard import Guard, jsonrpc_methods
from gateway.jsonbody import DEFAULT_BODY_LIMIT
from gateway.state import GatewayState

CARD = "/.well-known/agent-card.json"
_WRITES = frozenset({"SendMessage", "SendStreamingMessage", "CancelTask", "CreateTaskPushNotificationConfig",
                     "DeleteTaskPushNotificationConfig", "message/send", "message/stream", "tasks/cancel",
                     "tasks/pushNotificationConfig/set", "tasks/pushNotificationConfig/delete"})


class ReachContextBuilder(DefaultServerCallContextBuilder):
    """The SDK's call context, with the capability of the endpoint called (if one)."""

    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        capability = request.path_params.get("capability")
        if capability:
            context.state["capability"] = capability
        return context


def jsonrpc_role(method: str, path: str, body: Any) -> Role:
    return Role.PRODUCER if _WRITES.intersection(jsonrpc_methods(body)) else Role.READER


def rest_role(method: str, path: str, body: Any) -> Role:
    if method == "DELETE" or (method == "POST" and not path.endswith(":subscribe")):
        return Role.PRODUCER
    return Role.READER


def a2a_routes(gw: GatewayState) -> list[BaseRoute]:
    capabilities = Capabilities(gw)
    handler = ReachRequestHandler(gw, capabilities)
    builder = ReachContextBuilder()
    rpc = JsonRpcDispatcher(handler, builder, enable_v0_3_compat=True)
    limit = gw.settings.max_payload_bytes + DEFAULT_BODY_LIMIT
    rest = Router(create_rest_routes(handler, builder))

    async def rpc_endpoint(scope: Any, receive: Any, send: Any) -> None:
        response = await rpc.handle_requests(Request(scope, receive))
        await response(scope, receive, send)

    async def fleet(request: Request) -> Response:
        rows = await capabilities.live()
        return JSONResponse(agent_card_to_dict(fleet_card(_base(request), rows, await _secured(gw))))

    async def one(request: Request) -> Response:
        name = request.path_params["capability"]
        row = await capabilities.find(name) if CAPABILITY_RE.match(name) else None
        if row is None:
            return JSONResponse(error_body("not_found", f"no agent serves the capability {name!r}"), 404)
        return JSONResponse(agent_card_to_dict(capability_card(_base(request), row, await _secured(gw))))

    guarded_rpc = Guard(rpc_endpoint, gw, jsonrpc_role, limit)
    guarded_rest = Guard(rest, gw, rest_role, limit)
    return [
        Route(CARD, fleet, methods=["GET"]),
        Route(FLEET_PATH + CARD, fleet, methods=["GET"]),
        Route(AGENTS_PATH + "/{capability}" + CARD, one, methods=["GET"]),
        Route(FLEET_PATH, guarded_rpc, methods=["POST"]),
        Route(AGENTS_PATH + "/{capability}", guarded_rpc, methods=["POST"]),
        Mount(FLEET_PATH + REST_SUFFIX, app=guarded_rest),
        Mount(AGENTS_PATH + "/{capability}" + REST_SUFFIX, app=guarded_rest),
    ]


def _base(request: Request) -> str:
    return str(request.base_url).rstrip("/")


async def _secured(gw: GatewayState) -> bool:
    """Whether callers need a key (what the card's security scheme says)."""
    mode = gw.auth.mode
    if mode is AuthMode.OFF:
        return False
    # (read afresh: a key made a moment ago must show on the card)
    return mode is AuthMode.REQUIRED or bool(await gw.auth.cache.keys(newer_than=time.monotonic()))
