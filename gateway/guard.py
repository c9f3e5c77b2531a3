"""The gateway's API keys and body limit in front of the protocol endpoints (A2A, MCP), whose
SDKs know nothing of either: an ASGI app that reads the body (413 past the limit), asks the
endpoint which role the request needs (its JSON-RPC method, or its HTTP method and path), checks
the caller's key for it (401/403 as the rest of the API answers them) and hands the request on
with its body replayed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from broker import codec
from gateway.apikeys import Role
from gateway.auth import bearer_token
from gateway.errors import ApiError, error_response
from gateway.jsonbody import check_body_depth, receive_body
from gateway.state import GatewayState

PROTOCOL_ENVELOPE_LEVELS = 8
"""Levels a JSON-RPC request adds around a payload (params, message, parts, part, data ...)."""

RoleOf = Callable[[str, str, Any], Role]
"""(HTTP method, path, the body's JSON or None) -> the role the request needs."""


def jsonrpc_methods(body: Any) -> list[str]:
    """The JSON-RPC methods a body calls (a batch calls several)."""
    calls = body if isinstance(body, list) else [body]
    return [str(c.get("method")) for c in calls if isinstance(c, dict)]


class Guard:
    def __init__(self, app: ASGIApp, gw: GatewayState, role_of: RoleOf, limit: int) -> None:
        self.app = app
        self.gw = gw
        self.role_of = role_of
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            body = (await receive_body(receive, self.limit, headers.get("content-length"))
                    if scope["method"] in ("POST", "PUT") else b"")
            check_body_depth(body, self.gw.settings.max_json_depth, PROTOCOL_ENVELOPE_LEVELS)
            role = self.role_of(scope["method"], scope["path"], _json_or_none(body))
            client = scope.get("client")
            await self.gw.auth.check(bearer_token(headers.get("authorization")), role,
                                     client[0] if client else None)
        except ApiError as exc:
            await error_response(exc)(scope, receive, send)
            return
        await self.app(scope, _replay(body, receive) if body else receive, send)


def _json_or_none(body: bytes) -> Any:
    if not body:
        return None
    try:
        return codec.loads(body)
    except (ValueError, RecursionError):
        return None  # (the endpoint answers a body that is not JSON in its protocol's words)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # (the disconnect, for streams that watch for it)

    return replay
