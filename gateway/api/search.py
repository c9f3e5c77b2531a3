"""Task search: GET /v1/tasks, one page of recent tasks (broker/ops/search.py), newest first."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request

from broker.durations import parse_duration_ms
from broker.errors import BadInput
from broker.ids import CAPABILITY_RE
from broker.models import TaskState
from broker.ops.search import DEFAULT_LIMIT, MAX_LABEL, MAX_LIMIT, TaskQuery, search_tasks
from gateway.apikeys import KeyRecord, Role
from gateway.auth import require
from gateway.errors import ApiError
from gateway.models import ErrorBody, TaskPageJson
from gateway.state import state_of

router = APIRouter(prefix="/v1", tags=["tasks"],
                   responses={code: {"model": ErrorBody} for code in (401, 403, 422, 503)})
Reader = Annotated[KeyRecord | None, Depends(require(Role.READER))]


def query_of(capability: str | None, state: TaskState | None, agent: str | None, trace: str | None,
             since: str | None, limit: int, cursor: str | None) -> TaskQuery:
    """The search a request asks for; ApiError 422 naming the field that is wrong."""
    try:
        since_ms = parse_duration_ms(since, "since") if since else None
    except BadInput as exc:
        raise ApiError(422, "invalid_request", str(exc), field="since") from None
    try:
        return TaskQuery(capability=capability or None, state=state, agent_id=agent or None,
                         trace_id=trace or None, since_ms=since_ms, limit=limit,
                         cursor=cursor or None).checked()
    except BadInput as exc:
        raise ApiError(422, "invalid_request", str(exc), field="cursor" if "cursor" in str(exc) else None
                       ) from None


@router.get("/tasks", response_model=TaskPageJson, summary="Find recent tasks")
async def list_tasks(
    request: Request, _: Reader,
    capability: Annotated[str | None, Query(pattern=CAPABILITY_RE.pattern.removesuffix("\\Z") + "$",
                                            description="only this capability")] = None,
    state: Annotated[TaskState | None, Query(description="only tasks in this state")] = None,
    agent: Annotated[str | None, Query(max_length=MAX_LABEL,
                                       description="only tasks this agent ran last")] = None,
    trace: Annotated[str | None, Query(max_length=MAX_LABEL, description="only tasks of this trace")] = None,
    since: Annotated[str | None, Query(max_length=32,
                                       description="only tasks this recent: 15m, 1h, 2d")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = DEFAULT_LIMIT,
    cursor: Annotated[str | None, Query(max_length=128, description="next_cursor of the page before")] = None,
) -> dict[str, Any]:
    """Recent tasks (kept for the result TTL), newest first: by submit time, or for `failed` and
    `canceled` by when they ended. A page reads a bounded number of records: a filter that few
    tasks match may answer fewer than `limit` with a `next_cursor`; `next_cursor` is null once
    no older task is left."""
    gw = state_of(request.app)
    query = query_of(capability, state, agent, trace, since, limit, cursor)
    page = await gw.in_thread(lambda r: search_tasks(r, gw.settings, query))
    return page.as_dict()
