"""Errors as the gateway answers them: `{"error": {"code": ..., "message": ...}}` with the status
users expect.

    422 invalid_request     a field is wrong (the message and `field` name it)
    400 invalid_json        the body is not strict JSON (NaN and Infinity are refused)
    413 payload_too_large   a payload over max_payload_bytes (metadata: max_metadata_bytes), or a
                            body over the route's limit
    422 nested_too_deep     JSON nested deeper than max_json_depth
    401 unauthorized        no API key, or one the gateway does not know
    403 forbidden           the key's role may not do this, or Redis's ACL refused the
                            gateway's own Redis user (its rule: `reach acl --role gateway`)
    404 unknown_task, not_found
    409 stale, conflict
    429 queue_full          with Retry-After
    429 rate_limited        over gateway_rate_limit for the API key (or address), with Retry-After
    503 unavailable         Redis cannot be reached (with Retry-After)
    500 internal            a bug: logged with its traceback, never shown
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from broker.acl import denied, is_permission_error
from broker.errors import (
    BadInput,
    BrokerUnavailable,
    NestedTooDeep,
    PayloadTooLarge,
    PermissionDenied,
    QueueFull,
    UnknownTask,
)
from broker.infra.outages import TRANSIENT_ERRORS

log = logging.getLogger("reach.gateway")

RETRY_AFTER_S = 1
"""What Retry-After says of a full queue or an unreachable Redis."""

_HTTP_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
               405: "method_not_allowed", 406: "not_acceptable", 409: "conflict",
               413: "payload_too_large", 415: "unsupported_media_type", 429: "too_many_requests"}


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, *, field: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.headers = headers or {}


def error_body(code: str, message: str, field: str | None = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if field is not None:
        error["field"] = field
    return {"error": error}


def error_response(exc: ApiError) -> JSONResponse:
    return JSONResponse(error_body(exc.code, exc.message, exc.field), exc.status, headers=exc.headers)


def from_library(exc: Exception) -> ApiError:
    """The ApiError a library error means (anything else: internal)."""
    if isinstance(exc, PayloadTooLarge):
        return ApiError(413, "payload_too_large", str(exc))
    if isinstance(exc, NestedTooDeep):
        return ApiError(422, "nested_too_deep", str(exc))
    if isinstance(exc, BadInput):
        return ApiError(422, "invalid_request", str(exc))
    if isinstance(exc, UnknownTask):
        return ApiError(404, "unknown_task", str(exc))
    if isinstance(exc, QueueFull):
        return ApiError(429, "queue_full", str(exc), headers={"Retry-After": str(RETRY_AFTER_S)})
    if isinstance(exc, PermissionDenied) or (isinstance(exc, redis.exceptions.RedisError)
                                             and is_permission_error(exc)):
        error = exc if isinstance(exc, PermissionDenied) else denied(exc, "gateway")
        return ApiError(403, "forbidden", str(error))
    if isinstance(exc, (BrokerUnavailable, *TRANSIENT_ERRORS)):
        return ApiError(503, "unavailable", "Redis cannot be reached; try again shortly",
                        headers={"Retry-After": str(RETRY_AFTER_S)})
    return ApiError(500, "internal", "internal error (logged by the gateway)")


def validation_error(errors: Sequence[Any]) -> ApiError:
    """The 422 (or 400) of pydantic's errors, naming the first one's field."""
    first = errors[0] if errors else {}
    loc = [str(p) for p in first.get("loc", ())]
    where = loc[1:] if loc and loc[0] in ("body", "query", "path", "header") else loc
    field = ".".join(where) or None
    if first.get("type") == "json_invalid":
        return ApiError(400, "invalid_json", "the body is not valid JSON")
    message = f"{field}: {first.get('msg', 'invalid')}" if field else str(first.get("msg", "invalid request"))
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more)"
    return ApiError(422, "invalid_request", message, field=field)


def api_error_of(exc: Exception, request: str) -> ApiError:
    """What an exception of a handler answers, as the handlers below answer it (for the routes
    answered without the framework: gateway/hot.py); `request` names it in the log of a 500."""
    if isinstance(exc, ApiError):
        return exc
    mapped = from_library(exc)
    if mapped.status == 500:
        log.error("%s failed", request, exc_info=exc)
    return mapped


def install(app: FastAPI) -> None:
    """Make every error the app raises a JSON error of the one shape."""

    async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return error_response(exc)

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(validation_error(exc.errors()))

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = _HTTP_CODES.get(exc.status_code, "error")
        message = exc.detail if isinstance(exc.detail, str) else code
        return error_response(ApiError(exc.status_code, code, message, headers=dict(exc.headers or {})))

    async def on_library(request: Request, exc: Exception) -> JSONResponse:
        mapped = from_library(exc)
        if mapped.status == 500:
            log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        elif mapped.status == 403:
            log.warning("%s %s: %s", request.method, request.url.path, mapped.message)
        return error_response(mapped)

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    for kind in (BadInput, UnknownTask, QueueFull, BrokerUnavailable, PermissionDenied,
                 redis.exceptions.RedisError, Exception):
        app.add_exception_handler(kind, on_library)
