"""Tasks: submit (one or a batch), read, wait for the result, cancel."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import JSONResponse

from broker.errors import QueueFull
from broker.ids import split_task_id
from broker.protocol.submit import MAX_LABEL_LEN
from gateway.apikeys import KeyRecord, Role
from gateway.auth import credentials_of, require
from gateway.errors import ApiError, from_library
from gateway.jsonbody import json_route, openapi_body, read_model
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

MAX_WAIT_S = 60.0
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


def _task_id(task_id: str) -> str:
    try:
        split_task_id(task_id)
    except ValueError as exc:
        raise ApiError(422, "invalid_request", str(exc), field="task_id") from None
    return task_id


def _new_state(body: SubmitBody | BatchBody) -> str:
    return "scheduled" if body.delay_s is not None or body.at is not None else "queued"


@router.post("/tasks", status_code=202, response_model=Submitted, summary="Submit a task",
             responses={202: {"description": "queued"}},
             openapi_extra={**openapi_body(SubmitBody), "security": [{"HTTPBearer": []}],
                            "parameters": [IDEMPOTENCY_HEADER]})
async def submit(request: Request) -> JSONResponse:
    """Queue a task for a capability. With an `Idempotency-Key` header (or `idempotency_key`
    field), a repeated submit returns the first task (`created: false`)."""
    # (It reads its request itself: FastAPI's parameters and dependencies cost a quarter of a
    # submit's time; the document above says the same as they would.)
    gw = state_of(request.app)
    await gw.auth.check(credentials_of(request.headers.get("authorization")), Role.PRODUCER,
                        request.client.host if request.client else None)
    body = await read_model(request, SubmitBody)
    idempotency_key = request.headers.get("idempotency-key")
    if idempotency_key is not None and not 0 < len(idempotency_key) <= MAX_LABEL_LEN:
        raise ApiError(422, "invalid_request", f"Idempotency-Key must be 1 to {MAX_LABEL_LEN} characters",
                       field="Idempotency-Key")
    if idempotency_key and body.idempotency_key and idempotency_key != body.idempotency_key:
        raise ApiError(422, "invalid_request", "the Idempotency-Key header and the idempotency_key "
                       "field differ", field="idempotency_key")
    handle = await gw.client.submit(body.capability, body.payload, body.options(idempotency_key))
    state = _new_state(body)
    if not handle.created:
        state = (await gw.client.status(handle.task_id)).state.value
    return JSONResponse({"task_id": handle.task_id, "capability": body.capability, "state": state,
                         "created": handle.created}, 202)


@batch_router.post("/tasks/batch", status_code=202, response_model=BatchSubmitted,
                   summary=f"Submit up to {MAX_BATCH} tasks of one capability")
async def submit_batch(request: Request, body: BatchBody, _: Producer) -> JSONResponse:
    """The same options for every payload; one atomic write per 200 tasks. A full queue answers
    429 with the tasks queued before it filled (`error.queued`)."""
    gw = state_of(request.app)
    try:
        handles = await gw.client.submit_many(body.capability, body.payloads, body.options())
    except QueueFull as exc:
        mapped = from_library(exc)
        return JSONResponse({"error": {"code": mapped.code, "message": mapped.message,
                                       "queued": [h.task_id for h in exc.submitted]}},
                            429, headers=mapped.headers)
    state = _new_state(body)
    return JSONResponse({"tasks": [{"task_id": h.task_id, "capability": body.capability,
                                    "state": state, "created": h.created} for h in handles]}, 202)


@router.get("/tasks/{task_id}", response_model=TaskJson, summary="A task's state",
            responses={404: {"model": ErrorBody}})
async def get_task(request: Request, task_id: TaskId, _: Reader) -> dict[str, Any]:
    """The task as `reach status --json` shows it."""
    status = await state_of(request.app).client.status(_task_id(task_id))
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
    outcome = await state_of(request.app).results.wait(_task_id(task_id), wait)
    return JSONResponse(outcome.as_dict(task_id), 200 if outcome.ended else 202)


@router.post("/tasks/{task_id}/cancel", response_model=Canceled, summary="Cancel a task",
             responses={404: {"model": ErrorBody}})
async def cancel(request: Request, task_id: TaskId, _: Producer) -> dict[str, Any]:
    """Cancel a task wherever it is (queued, waiting for a retry, or running); `canceled` is
    false when it had ended already."""
    client = state_of(request.app).client
    task_id = _task_id(task_id)
    canceled = await client.cancel(task_id)
    state = (await client.status(task_id)).state.value
    return {"task_id": task_id, "canceled": canceled, "state": state}
