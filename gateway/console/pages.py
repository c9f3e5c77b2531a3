"""The console's read-only pages: Overview, Agents, Tasks (the search), Task, Schedules, Policy,
and the live stream they listen to."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import RedirectResponse, Response
from sse_starlette import EventSourceResponse, ServerSentEvent

from broker.durations import parse_duration_ms
from broker.errors import BadInput
from broker.ids import split_task_id
from broker.models import TaskState
from broker.ops import policy as policies
from broker.ops.schedules import list_all as list_schedules
from broker.ops.search import DEFAULT_LIMIT, TaskQuery, search_tasks
from broker.policy import FIELDS as POLICY_FIELDS
from gateway.console.access import ConsoleError, Viewer, reader
from gateway.console.console_state import console_of
from gateway.console.data import fleet_snapshot, task_detail
from gateway.console.render import page
from gateway.console.routing import ConsoleRoute
from gateway.state import state_of

router = APIRouter(prefix="/console", route_class=ConsoleRoute, include_in_schema=False)
Reader = Annotated[Viewer, Depends(reader)]
PING_S = 15


async def _snapshot(request: Request) -> Any:
    hub = console_of(request.app).hub
    if hub.snapshot is not None and hub.listeners:
        return hub.snapshot
    gw = state_of(request.app)
    return await gw.in_thread(lambda r: fleet_snapshot(r, gw.settings))


@router.get("")
async def overview(request: Request, viewer: Reader) -> Response:
    hub = console_of(request.app).hub
    snapshot = await _snapshot(request)
    return page(request, viewer, "overview.html", active="overview", snapshot=snapshot,
                activity=hub.activity, feed=list(hub.feed))


@router.get("/agents")
async def agents(request: Request, viewer: Reader) -> Response:
    return page(request, viewer, "agents.html", active="agents", snapshot=await _snapshot(request))


@router.get("/live")
async def live(request: Request, viewer: Reader) -> EventSourceResponse:
    hub = console_of(request.app).hub

    async def stream() -> AsyncIterator[ServerSentEvent]:
        async for name, html in hub.listen():
            yield ServerSentEvent(html, event=name)

    return EventSourceResponse(stream(), ping=PING_S)


def _state(text: str | None) -> TaskState | None:
    if not text:
        return None
    try:
        return TaskState(text)
    except ValueError:
        raise ConsoleError(400, f"unknown state {text[:40]!r}") from None


@router.get("/tasks")
async def tasks(request: Request, viewer: Reader,
                capability: Annotated[str, Query(max_length=64)] = "",
                state: Annotated[str, Query(max_length=20)] = "",
                agent: Annotated[str, Query(max_length=256)] = "",
                trace: Annotated[str, Query(max_length=256)] = "",
                since: Annotated[str, Query(max_length=32)] = "",
                cursor: Annotated[str, Query(max_length=128)] = "",
                find: Annotated[str, Query(alias="id", max_length=200)] = "") -> Response:
    if find.strip():  # (a task id typed in the search box: straight to its page)
        try:
            split_task_id(find.strip())
        except ValueError as exc:
            raise ConsoleError(400, str(exc)) from None
        return RedirectResponse(f"/console/tasks/{find.strip()}", 303)
    filters = {"capability": capability, "state": state, "agent": agent, "trace": trace, "since": since}
    try:
        query = TaskQuery(capability=capability or None, state=_state(state), agent_id=agent or None,
                          trace_id=trace or None, limit=DEFAULT_LIMIT, cursor=cursor or None,
                          since_ms=parse_duration_ms(since, "since") if since else None).checked()
    except BadInput as exc:
        raise ConsoleError(400, str(exc)) from None
    gw = state_of(request.app)
    result = await gw.in_thread(lambda r: search_tasks(r, gw.settings, query))
    snapshot = await _snapshot(request)
    kept = {k: v for k, v in filters.items() if v}
    next_url = (f"/console/tasks?{urlencode({**kept, 'cursor': result.next_cursor})}"
                if result.next_cursor else None)
    return page(request, viewer, "tasks.html", active="tasks", result=result, filters=filters,
                next_url=next_url, paged=bool(cursor), first_url=f"/console/tasks?{urlencode(kept)}",
                states=[s.value for s in TaskState],
                capabilities=[q.capability for q in snapshot.queues])


@router.get("/tasks/{task_id}")
async def task(request: Request, task_id: str, viewer: Reader) -> Response:
    from dispatcher.explain import explain  # (routing's code: loaded only when a task is shown)

    try:
        split_task_id(task_id)
    except ValueError as exc:
        raise ConsoleError(400, str(exc)) from None
    gw = state_of(request.app)
    detail = await gw.in_thread(lambda r: task_detail(r, gw.settings, task_id))
    try:
        routing = await gw.in_thread(lambda r: explain(r, gw.settings, task_id))
    except Exception:  # (explaining is a courtesy: a task whose routing cannot be read still shows)
        routing = None
    return page(request, viewer, "task.html", active="tasks", task=detail, routing=routing,
                show_payloads=gw.settings.console_show_payloads,
                request_done=request.query_params.get("done", ""))


@router.get("/schedules")
async def schedules(request: Request, viewer: Reader) -> Response:
    gw = state_of(request.app)
    rows = await gw.in_thread(lambda r: list_schedules(r, gw.settings))
    return page(request, viewer, "schedules.html", active="schedules", schedules=rows,
                show_payloads=gw.settings.console_show_payloads)


@router.get("/policy")
async def policy(request: Request, viewer: Reader) -> Response:
    gw = state_of(request.app)
    snapshot = await _snapshot(request)
    names = [q.capability for q in snapshot.queues]

    def read(r: Any) -> list[tuple[str, list[dict[str, Any]]]]:
        out = [("fleet default", policies.describe(policies.read(r, gw.settings, None)))]
        out += [(name, policies.describe(policies.read(r, gw.settings, name))) for name in names]
        return out

    return page(request, viewer, "policy.html", active="policy", policies=await gw.in_thread(read),
                fields=POLICY_FIELDS, paused={q.capability: q.paused for q in snapshot.queues},
                request_done={"paused": "paused", "resumed": "resumed"}.get(
                    request.query_params.get("done", ""), ""))
