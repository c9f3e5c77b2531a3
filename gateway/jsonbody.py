"""Request bodies as the gateway reads them: strict JSON (NaN and Infinity refused, as the
client refuses them), of a bounded size (413 past it, before the rest is read), and JSON whatever
the client forgot to say (a body with no Content-Type is read as JSON; another type is refused).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from fastapi import Request, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.types import Receive

from broker import codec, limits
from broker.errors import NestedTooDeep
from gateway.errors import ApiError

DEFAULT_BODY_LIMIT = 2 * 1024 * 1024 + 65536
M = TypeVar("M", bound="BaseModel")


class LimitedJsonRequest(Request):
    limit = DEFAULT_BODY_LIMIT

    async def body(self) -> bytes:
        if not hasattr(self, "_body"):
            declared = self.headers.get("content-length", "")
            if declared.isascii() and declared.isdigit() and int(declared) > self.limit:
                raise _too_large(self.limit)
            chunks: list[bytes] = []
            size = 0
            async for chunk in self.stream():
                size += len(chunk)
                if size > self.limit:
                    raise _too_large(self.limit)
                chunks.append(chunk)
            self._body = b"".join(chunks)
        return self._body

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            check_body_depth(body, self.app.state.gateway.settings.max_json_depth)
            self._json = parse_json(body)
        return self._json


ENVELOPE_LEVELS = 2
"""Levels a body adds around what it carries (a submit's object; a batch's object and list)."""


def check_body_depth(body: bytes, max_depth: int, envelope: int = ENVELOPE_LEVELS) -> None:
    """422 nested_too_deep for a body nested deeper than max_json_depth allows what it carries
    (checked before it is parsed: a deep body costs nothing more than a count of its brackets)."""
    try:
        limits.check_depth(body, max_depth + envelope, "the request body")
    except NestedTooDeep as exc:
        raise ApiError(422, "nested_too_deep", f"{exc} + {envelope} for the body's own levels") from None


def parse_json(body: bytes) -> Any:
    try:
        return codec.loads(body)
    except (ValueError, RecursionError) as exc:
        raise ApiError(400, "invalid_json", f"the body is not strict JSON: {exc}") from None


async def receive_body(receive: Receive, limit: int, declared: str | None) -> bytes:
    """A request's whole body read from ASGI messages (for the apps that read their requests
    themselves: gateway/hot.py, gateway/guard.py); 413 past `limit`, before the rest is read."""
    if declared is not None and declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ApiError(400, "bad_request", "the client went away")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def check_media_type(content_type: str | None) -> None:
    """415 unless the body is JSON (or says nothing of its type: curl --data-binary without -H
    sends none, and it is JSON here)."""
    if content_type is not None and not _is_json(content_type):
        raise ApiError(415, "unsupported_media_type",
                       f"send JSON (Content-Type: application/json), not {content_type}")


def _too_large(limit: int) -> ApiError:
    return ApiError(413, "payload_too_large", f"the request body is over the limit of {limit} bytes")


def _is_json(content_type: str) -> bool:
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


def openapi_body(model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI `requestBody` of a route that reads its body itself as `model`."""
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": model.model_json_schema(ref_template="#/components/schemas/{model}")}}}}


def json_route(limit: int = DEFAULT_BODY_LIMIT) -> type[APIRoute]:
    """A route class whose requests read their body as LimitedJsonRequest with `limit` bytes."""
    request_class = type("LimitedJsonRequest", (LimitedJsonRequest,), {"limit": limit})

    class JsonRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()
            takes_body = self.body_field is not None or bool(
                (self.openapi_extra or {}).get("requestBody"))  # (a route that reads it itself)

            async def read_json(request: Request) -> Response:
                if takes_body:
                    content_type = request.headers.get("content-type")
                    check_media_type(content_type)
                    if content_type is None:  # (for FastAPI, which reads only a typed body as JSON)
                        request.scope["headers"] = [*request.scope["headers"],
                                                    (b"content-type", b"application/json")]
                limited = request_class(request.scope, request.receive)
                if takes_body and await limited.body():
                    await limited.json()  # (its errors are ours: FastAPI would hide them in a 400)
                return await handler(limited)

            return read_json

    return JsonRoute
