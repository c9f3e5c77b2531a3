"""The console's forms that change something: logging in and out, canceling a task, pausing and
resuming a capability. Each is a POST carrying the session's CSRF token (access.checked_post);
the actions need an operator."""

from __future__ import annotations

import logging
from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Query, Request
from fastapi.responses import RedirectResponse, Response

from broker.ids import check_capability, split_task_id
from broker.ops import policy as policies
from broker.scripts import Scripts
from gateway.console import session as sessions
from gateway.console.access import ConsoleError, checked_post, viewer_of
from gateway.console.console_state import console_of
from gateway.console.forms import field, read_form
from gateway.console.render import page, set_session
from gateway.console.routing import ConsoleRoute
from gateway.state import state_of

log = logging.getLogger("reach.gateway")
router = APIRouter(prefix="/console", route_class=ConsoleRoute, include_in_schema=False)


def _safe_next(target: str) -> str:
    """Only a console path (never another site) to go back to after logging in."""
    return target if target.startswith("/console") and not target.startswith("//") else "/console"


@router.get("/login")
async def login_form(request: Request, next: Annotated[str, Query(max_length=500)] = "/console") -> Response:
    viewer = await viewer_of(request)
    if viewer.logged_in and not viewer.open:
        return RedirectResponse(_safe_next(next), 303)
    return page(request, viewer, "login.html", next_url=_safe_next(next), failed=False)


@router.post("/login")
async def login(request: Request) -> Response:
    form = await read_form(request)
    viewer = await checked_post(request, form, operator=False)
    next_url = _safe_next(field(form, "next", "/console"))
    gw = state_of(request.app)
    record = await gw.auth.cache.find(field(form, "key")) if field(form, "key") else None
    if record is None:
        return page(request, viewer, "login.html", 401, next_url=next_url, failed=True)
    keys = await gw.auth.cache.keys()
    sha = next(s for s, r in keys.items() if r.id == record.id)
    secret = await console_of(request.app).secret.get()
    response = RedirectResponse(next_url, 303)
    set_session(request, response, sessions.encode(secret, sessions.new_session(record.id), sha))
    log.info("console: %s key %s logged in", record.role.value, record.id)
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    await checked_post(request, await read_form(request), operator=False)
    response = RedirectResponse("/console/login", 303)
    set_session(request, response, None)
    return response


@router.post("/tasks/{task_id}/cancel")
async def cancel(request: Request, task_id: str) -> Response:
    viewer = await checked_post(request, await read_form(request))
    try:
        split_task_id(task_id)
    except ValueError as exc:
        raise ConsoleError(400, str(exc)) from None
    canceled = await state_of(request.app).client.cancel(task_id)
    log.info("console: %s canceled %s (%s)", viewer.name, task_id, canceled)
    done = "canceled" if canceled else "not_canceled"
    return RedirectResponse(f"/console/tasks/{quote(task_id)}?done={done}", 303)


@router.post("/policy/{capability}/pause")
async def pause(request: Request, capability: str) -> Response:
    return await _set_paused(request, capability, True)


@router.post("/policy/{capability}/resume")
async def resume(request: Request, capability: str) -> Response:
    return await _set_paused(request, capability, False)


async def _set_paused(request: Request, capability: str, paused: bool) -> Response:
    form = await read_form(request)
    viewer = await checked_post(request, form)
    check_capability(capability)
    reason = field(form, "reason")[:200] if paused else ""
    gw = state_of(request.app)
    who = f"console:{viewer.name}"
    await gw.in_thread(lambda r: policies.set_fields(r, Scripts(r), gw.settings, capability,
                                                     {"paused": paused, "paused_reason": reason}, who))
    return RedirectResponse(f"/console/policy?done={'paused' if paused else 'resumed'}", 303)
