"""A task's events as Server-Sent Events: one SSE event per task event, its sequence number as
the SSE `id`, its type as the SSE `event`, the event as JSON in `data`. A client that reconnects
with `Last-Event-ID` (browsers' EventSource does) gets what came after it; the stream ends after
the task's terminal event."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request
from sse_starlette import EventSourceResponse, ServerSentEvent

from broker import codec
from gateway.api.tasks import TaskId
from gateway.apikeys import KeyRecord, Role
from gateway.auth import require
from gateway.errors import ApiError
from gateway.follow import follow
from gateway.hot import task_id_of
from gateway.models import ErrorBody
from gateway.state import state_of

PING_S = 15
"""A comment line this often keeps proxies from closing a quiet stream."""

router = APIRouter(prefix="/v1", tags=["tasks"])


def _resume_point(last_event_id: str | None, after: int | None) -> int:
    if last_event_id is None or not last_event_id.strip():
        return after or 0
    text = last_event_id.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 12:  # ('²'.isdigit() too)
        raise ApiError(422, "invalid_request", f"Last-Event-ID must be an event's sequence number, "
                       f"got {text[:40]!r}", field="Last-Event-ID")
    return int(text)


@router.get("/tasks/{task_id}/events", summary="Follow a task's events (Server-Sent Events)",
            response_class=EventSourceResponse,
            responses={200: {"content": {"text/event-stream": {}},
                             "description": "one SSE event per task event, until the terminal one"},
                       401: {"model": ErrorBody}, 403: {"model": ErrorBody},
                       404: {"model": ErrorBody}, 422: {"model": ErrorBody}})
async def events(request: Request, task_id: TaskId,
                 _: Annotated[KeyRecord | None, Depends(require(Role.READER))],
                 last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", max_length=64)] = None,
                 after: Annotated[int | None, Query(ge=0, le=10**12,
                                                    description="resume after this seq "
                                                                "(as Last-Event-ID)")] = None,
                 ) -> EventSourceResponse:
    gw = state_of(request.app)
    task_id = task_id_of(task_id)
    start = _resume_point(last_event_id, after)
    await gw.client.get(task_id)  # (UnknownTask, a 404, before the stream starts)

    async def stream() -> AsyncIterator[ServerSentEvent]:
        async for event in follow(gw.settings, gw.scripts, gw.listener, task_id, start, gw.stream_reads):
            data: dict[str, Any] = event.as_dict()
            yield ServerSentEvent(codec.dumps(data), event=event.type, id=str(event.seq))

    return EventSourceResponse(stream(), ping=PING_S)
