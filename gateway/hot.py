"""The two calls producers make most, answered before the web framework sees them: POST
/v1/tasks and GET /v1/tasks/{id}/result.

FastAPI's routing (past every console and protocol route), its parameters, dependencies,
middleware and telemetry checks cost a submit more CPU than the submit's own work (issue 25's
benchmark, docs/benchmarks.md). The app (gateway/app.py) lets HotRoutes answer these two
requests first, with what the routes do: the body read within its limit (413), JSON only (415)
and strict (400), the API key checked (401/403), the same pydantic model and constraints (a 422
naming the field), the same JSON errors. Any other request goes on to FastAPI, whose routes for
these two stay in /openapi.json and call the same functions (submit_task, task_result) when one
reaches them (an app served under a root_path). So FastAPI's own OpenTelemetry hooks do not see
these two.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable
from dataclasses import replace
from typing import Annotated, Any
from urllib.parse import parse_qsl

from pydantic import Field, TypeAdapter, ValidationError
from starlette.types import Receive, Scope, Send

from broker.ids import split_task_id
from broker.protocol.submit import MAX_LABEL_LEN, SubmitOptions
from gateway.apikeys import Role
from gateway.auth import bearer_token
from gateway.errors import ApiError, api_error_of, error_body, validation_error
from gateway.jsonbody import DEFAULT_BODY_LIMIT, check_body_depth, check_media_type, parse_json, receive_body
from gateway.models import BatchBody, SubmitBody, TaskOptions
from gateway.state import GatewayState

MAX_WAIT_S = 60.0
SUBMIT_PATH = "/v1/tasks"
_TASKS, _RESULT = "/v1/tasks/", "/result"
_WAIT = TypeAdapter(Annotated[float, Field(ge=0, le=MAX_WAIT_S, allow_inf_nan=False)])
"""GET .../result's `wait`, as the FastAPI route declares it."""
_JSON = (b"content-type", b"application/json")
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
"""The answers' JSON, as Starlette's JSONResponse renders it (one encoder, not one per answer)."""


def task_id_of(task_id: str) -> str:
    """`task_id` if it is one (a 422 naming the field otherwise)."""
    try:
        split_task_id(task_id)
    except ValueError as exc:
        raise ApiError(422, "invalid_request", str(exc), field="task_id") from None
    return task_id


def new_state(body: SubmitBody | BatchBody) -> str:
    return "scheduled" if body.delay_s is not None or body.at is not None else "queued"


def with_trace_headers(body: TaskOptions, options: SubmitOptions, traceparent: str | None,
                       tracestate: str | None) -> SubmitOptions:
    """The options with the request's W3C `traceparent`/`tracestate` headers (the library checks
    them: a malformed one is a 422 naming it, and nothing is queued)."""
    for name, header in (("traceparent", traceparent), ("tracestate", tracestate)):
        if header is not None and getattr(body, name) not in (None, header):
            raise ApiError(422, "invalid_request", f"the {name} header and the {name} field differ",
                           field=name)
    if traceparent is None and tracestate is None:
        return options
    return replace(options, traceparent=traceparent or options.traceparent,
                   tracestate=tracestate or options.tracestate)


async def submit_task(gw: GatewayState, data: Any, idempotency_key: str | None,
                      traceparent: str | None = None, tracestate: str | None = None) -> dict[str, Any]:
    """POST /v1/tasks once its caller's key is checked: `data`, the body's JSON; the trace
    context headers, if any."""
    try:
        body = SubmitBody.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc.errors()) from None
    if idempotency_key is not None and not 0 < len(idempotency_key) <= MAX_LABEL_LEN:
        raise ApiError(422, "invalid_request", f"Idempotency-Key must be 1 to {MAX_LABEL_LEN} characters",
                       field="Idempotency-Key")
    if idempotency_key and body.idempotency_key and idempotency_key != body.idempotency_key:
        raise ApiError(422, "invalid_request", "the Idempotency-Key header and the idempotency_key "
                       "field differ", field="idempotency_key")
    options = with_trace_headers(body, body.options(idempotency_key), traceparent, tracestate)
    handle = await gw.client.submit(body.capability, body.payload, options)
    state = new_state(body)
    if not handle.created:
        state = (await gw.client.status(handle.task_id)).state.value
    return {"task_id": handle.task_id, "capability": body.capability, "state": state,
            "created": handle.created}


async def task_result(gw: GatewayState, task_id: str, wait_s: float) -> tuple[int, dict[str, Any]]:
    """GET /v1/tasks/{id}/result once its caller's key is checked: 200 and the outcome once the
    task ended, else 202 and its state after `wait_s` seconds (woken by the task's pub/sub)."""
    outcome = await gw.results.wait(task_id_of(task_id), wait_s)
    return 200 if outcome.ended else 202, outcome.as_dict(task_id)


class HotRoutes:
    def __init__(self, gateway: GatewayState) -> None:
        self.gw = gateway

    async def answer(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """Answer the request if it is one of the two; False (and nothing done) if not."""
        if scope["type"] != "http" or scope.get("root_path"):
            return False
        path, method = scope["path"], scope["method"]
        if path == SUBMIT_PATH and method == "POST":
            await _answer(send, self._submit(scope, receive), "POST /v1/tasks")
            return True
        if method == "GET" and path.startswith(_TASKS) and path.endswith(_RESULT):
            task_id = path[len(_TASKS):-len(_RESULT)]
            if task_id and "/" not in task_id:
                await _answer(send, self._result(scope, task_id), "GET /v1/tasks/{id}/result")
                return True
        return False

    async def _submit(self, scope: Scope, receive: Receive) -> tuple[int, Any]:
        headers = _headers(scope)
        check_media_type(headers.get(b"content-type"))
        body = await receive_body(receive, DEFAULT_BODY_LIMIT, headers.get(b"content-length"))
        check_body_depth(body, self.gw.settings.max_json_depth)
        data = parse_json(body)
        await self.gw.auth.check(bearer_token(headers.get(b"authorization")), Role.PRODUCER, _peer(scope))
        return 202, await submit_task(self.gw, data, headers.get(b"idempotency-key"),
                                      headers.get(b"traceparent"), headers.get(b"tracestate"))

    async def _result(self, scope: Scope, task_id: str) -> tuple[int, Any]:
        headers = _headers(scope)
        await self.gw.auth.check(bearer_token(headers.get(b"authorization")), Role.READER, _peer(scope))
        return await task_result(self.gw, task_id, _wait_of(scope["query_string"]))


_WANTED = (b"authorization", b"content-type", b"content-length", b"idempotency-key", b"traceparent",
           b"tracestate")


def _peer(scope: Scope) -> str | None:
    """The client's address (the rate limit's key for a call without an API key)."""
    client = scope.get("client")
    return str(client[0]) if client else None


def _headers(scope: Scope) -> dict[bytes, str]:
    """The headers these routes read (the first of each, as Starlette's Headers.get)."""
    found: dict[bytes, str] = {}
    for name, value in scope["headers"]:
        if name in _WANTED and name not in found:
            found[name] = value.decode("latin-1")
    return found


def _wait_of(query_string: bytes) -> float:
    text = None
    if query_string:
        for name, value in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True):
            if name == "wait":
                text = value  # (the last, as Starlette's QueryParams.get)
    if text is None:
        return 0.0
    try:
        return _WAIT.validate_python(text)
    except ValidationError as exc:
        raise validation_error([{**e, "loc": ("query", "wait", *e["loc"])} for e in exc.errors()]) from None


async def _answer(send: Send, answer: Awaitable[tuple[int, Any]], request: str) -> None:
    headers: dict[str, str] = {}
    try:
        status, value = await answer
    except Exception as exc:
        error = api_error_of(exc, request)
        status, headers = error.status, error.headers
        value = error_body(error.code, error.message, error.field)
    body = _ENCODER.encode(value).encode()
    raw = [(b"content-length", str(len(body)).encode()), _JSON]
    raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})
