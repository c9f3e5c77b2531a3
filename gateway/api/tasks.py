"""Tasks: submit (one or a batch), read, wait for the result, cancel."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import JSONResponse

from broker.errors import QueueFull
from broker.protocol.submit import MAX_LABEL_LEN
from broker.protocol.trace import MAX_TRACESTATE_LEN
from gateway.apikeys import KeyRecord, Role
from gateway.auth import bearer_token, require
from gateway.errors import from_library
from gateway.hot import MAX_WAIT_S, new_state, submit_task, task_id_of, task_result, with_trace_headers
from gateway.jsonbody import json_route, openapi_body
from gateway.models import (
    MAX_BATCH,
    BatchBody,
    BatchSubmitted,
    Canceled,
    ErrorBody,
    SubmitBody,
    Submitted,
    TaskJson,
    TaskResult,
)
from gateway.state import state_of

BATCH_BODY_LIMIT = 32 * 1024 * 1024
"""A batch's body: up to MAX_BATCH payloads, but not MAX_BATCH of the largest (send those singly)."""

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 401, 403, 413, 415, 422, 429, 503)
}
router = APIRouter(prefix="/v1", tags=["tasks"], route_class=json_route(), responses=_ERRORS)
batch_router = APIRouter(prefix="/v1", tags=["tasks"], route_class=json_route(BATCH_BODY_LIMIT),
                         responses=_ERRORS)

TaskId = Annotated[str, Path(description="a task id as submit returned it, '<capability>:<ULID>'",
                             examples=["summarize:01JB0000000000000000000000"])]
Producer = Annotated[KeyRecord | None, Depends(require(Role.PRODUCER))]
Reader = Annotated[KeyRecord | None, Depends(require(Role.READER))]
IDEMPOTENCY_HEADER = {"name": "Idempotency-Key", "in": "header", "required": False,
                      "description": "a repeated key returns the first task",
                      "schema": {"type": "string", "minLength": 1, "maxLength": MAX_LABEL_LEN}}
TRACE_HEADERS = [
    {"name": "traceparent", "in": "header", "required": False,
     "description": "W3C trace context the tasks run in (as the `traceparent` field)",
     "schema": {"type": "string", "minLength": 1, "maxLength": MAX_LABEL_LEN}},
    {"name": "tracestate", "in": "header", "required": False,
     "description": "W3C tracestate, with a traceparent",
     "schema": {"type": "string", "minLength": 1, "maxLength": MAX_TRACESTATE_LEN}},
]


@router.post("/tasks", status_code=202, response_model=Submitted, summary="Submit a task",
             responses={202: {"description": "queued"}},
             openapi_extra={**openapi_body(SubmitBody), "security": [{"HTTPBearer": []}],
                            "parameters": [IDEMPOTENCY_HEADER, *TRACE_HEADERS]})
async def submit(request: Request) -> JSONResponse:
    """Queue a task for a capability. With an `Idempotency-Key` header (or `idempotency_key`
    field), a repeated submit returns the first task (`created: false`)."""
    # (gateway/hot.py answers this request before FastAPI does, with the same functions: this
    # route documents it, and serves it under a root_path. Its body is read as the document
    # above says, not by FastAPI's parameters.)
    gw = state_of(request.app)
    await gw.auth.check(bearer_token(request.headers.get("authorization")), Role.PRODUCER,
                        request.client.host if request.client else None)
    headers = request.headers
    return JSONResponse(await submit_task(gw, await request.json(), headers.get("idempotency-key"),
                                          headers.get("traceparent"), headers.get("tracestate")), 202)


@batch_router.post("/tasks/batch", status_code=202, response_model=BatchSubmitted,
                   summary=f"Submit up to {MAX_BATCH} tasks of one capability",
                   openapi_extra={"parameters": TRACE_HEADERS})
async def submit_batch(request: Request, body: BatchBody, _: Producer) -> JSONResponse:
    """The same options for every payload; one atomic write per 200 tasks. A full queue answers
    429 with the tasks queued before it filled (`error.queued`)."""
    gw = state_of(request.app)
    try:
        options = with_trace_headers(body, body.options(), request.headers.get("traceparent"),
                                     request.headers.get("tracestate"))
        handles = await gw.client.submit_many(body.capability, body.payloads, options)
    except QueueFull as exc:
        mapped = from_library(exc)
        return JSONResponse({"error": {"code": mapped.code, "message": mapped.message,
                                       "queued": [h.task_id for h in exc.submitted]}},
                            429, headers=mapped.headers)
    state = new_state(body)
    return JSONResponse({"tasks": [{"task_id": h.task_id, "capability": body.capability,
                                    "state": state, "created": h.created} for h in handles]}, 202)


@router.get("/tasks/{task_id}", response_model=TaskJson, summary="A task's state",
            responses={404: {"model": ErrorBody}})
async def get_task(request: Request, task_id: TaskId, _: Reader) -> dict[str, Any]:
    """The task as `reach status --json` shows it."""
    status = await state_of(request.app).client.status(task_id_of(task_id))
    return status.cli_dict()


@router.get("/tasks/{task_id}/result", response_model=TaskResult, summary="A task's outcome",
            responses={202: {"model": TaskResult, "description": "not finished yet"},
                       404: {"model": ErrorBody}})
async def get_result(request: Request, task_id: TaskId, _: Reader,
                     wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S, allow_inf_nan=False,
                                                  description="seconds to wait for the end")] = 0
                     ) -> JSONResponse:
    """200 with `state` succeeded (and `result`), failed (`reason`, `error`) or canceled once the
    task ended; 202 with its current `state` while it has not, after waiting up to `wait` s."""
    # (gateway/hot.py answers this request before FastAPI does: see submit)
    status, outcome = await task_result(state_of(request.app), task_id, wait)
    return JSONResponse(outcome, status)


@router.post("/tasks/{task_id}/cancel", response_model=Canceled, summary="Cancel a task",
             responses={404: {"model": ErrorBody}})
async def cancel(request: Request, task_id: TaskId, _: Producer) -> dict[str, Any]:
    """Cancel a task wherever it is (queued, waiting for a retry, or running); `canceled` is
    false when it had ended already."""
    client = state_of(request.app).client
    task_id = task_id_of(task_id)
    canceled = await client.cancel(task_id)
    state = (await client.status(task_id)).state.value
    return {"task_id": task_id, "canceled": canceled, "state": state}
