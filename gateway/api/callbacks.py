"""Callbacks of HTTP agents: an agent that answered a task with 202 (accept-then-callback) posts
the outcome here, with the attempt's token from the request's `X-Reach-Callback-Token`. The
token is the credential (no API key): it names the attempt, and only the current attempt's
callback is taken (a superseded attempt's is refused with 409, like any report of it)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Request

from broker import codec
from broker.errors import InvalidPayload, PayloadTooLarge
from broker.protocol.callbacks import callback_call, parse_status, parse_token
from broker.protocol.calls import Status
from gateway.api.tasks import TaskId
from gateway.errors import ApiError
from gateway.hot import task_id_of
from gateway.jsonbody import json_route
from gateway.models import CallbackBody, CallbackTaken, ErrorBody
from gateway.state import state_of

TOKEN_HEADER = "X-Reach-Callback-Token"

router = APIRouter(prefix="/v1", tags=["callbacks"], route_class=json_route(),
                   responses={code: {"model": ErrorBody} for code in (400, 401, 404, 409, 413, 422, 503)})

_REFUSALS = {
    Status.REFUSED: (401, "unauthorized", "this callback token was not given to any attempt of the task"),
    Status.STALE: (409, "stale", "the attempt this token belongs to is over (superseded, or the "
                                 "task ended): its outcome is not taken"),
    Status.GONE: (404, "unknown_task", "no such task (never submitted, or its record expired)"),
}


@router.post("/callbacks/{task_id}", response_model=CallbackTaken,
             summary="An HTTP agent posts the outcome of a task it accepted")
async def callback(request: Request, task_id: TaskId, body: CallbackBody,
                   token: Annotated[str | None, Header(alias=TOKEN_HEADER, max_length=256)] = None
                   ) -> dict[str, Any]:
    gw = state_of(request.app)
    task_id = task_id_of(task_id)
    parsed = parse_token(token) if token else None
    if parsed is None:
        raise ApiError(401, "unauthorized", f"send the attempt's callback token in {TOKEN_HEADER}")
    outcome = body.model_dump(exclude_none=True)
    try:
        text = codec.encode_payload(outcome, gw.settings.max_result_bytes + 65536, "callback",
                                    gw.settings.max_json_depth + 1, "max_result_bytes")
    except PayloadTooLarge as exc:
        raise ApiError(413, "payload_too_large", str(exc)) from None
    except InvalidPayload as exc:  # (nested too deeply, a lone surrogate)
        raise ApiError(422, "invalid_request", str(exc)) from None
    status = parse_status(await gw.scripts(callback_call(gw.settings, task_id, parsed, text)))
    if status in _REFUSALS:
        code, name, message = _REFUSALS[status]
        raise ApiError(code, name, message)
    return {"accepted": True, "duplicate": status is Status.DUP}
