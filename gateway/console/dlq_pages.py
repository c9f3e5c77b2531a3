"""Dead letters in the console: the list (filtered by capability, reason and age), one letter,
and replay and purge, of one, of those ticked, or of every letter the filter matches. Every
action first shows a confirmation that says how many letters it will touch; the confirmation
posts exactly that selection (the ids, or the filter bounded by the time it was shown, so that
letters that arrive meanwhile are not swept in)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import RedirectResponse, Response

from broker.durations import parse_duration_ms
from broker.errors import BadInput
from broker.keys import CapabilityKeys
from dlq_tools import Filter, Page, ReplayOptions, Target
from gateway.console.access import ConsoleError, Viewer, checked_post, reader
from gateway.console.console_state import console_of
from gateway.console.forms import read_form
from gateway.console.render import page
from gateway.console.routing import ConsoleRoute
from gateway.state import state_of

log = logging.getLogger("reach.gateway")
router = APIRouter(prefix="/console", route_class=ConsoleRoute, include_in_schema=False)
Reader = Annotated[Viewer, Depends(reader)]
PAGE = 50
MAX_REFS = 1000
REPLAY_RATE = 500.0
"""Letters requeued per second by a console replay (the CLI's default is gentler)."""
ACTIONS = ("replay", "purge")


@dataclass(frozen=True, slots=True)
class Selection:
    """What an action covers: named letters (`refs`), or those the filter matches that died
    before `until_ms`."""

    refs: tuple[str, ...]
    capability: str
    reason: str
    since: str
    until_ms: int | None

    def filter(self, now_ms: int) -> Filter:
        since_ms = now_ms - parse_duration_ms(self.since, "since") if self.since else None
        return Filter(capability=self.capability or None, reason=self.reason or None, since_ms=since_ms,
                      until_ms=self.until_ms)

    def fields(self) -> list[tuple[str, str]]:
        out = [("ref", r) for r in self.refs]
        out += [(k, v) for k, v in (("capability", self.capability), ("reason", self.reason),
                                    ("since", self.since)) if v]
        if self.until_ms is not None:
            out.append(("until_ms", str(self.until_ms)))
        return out


def _selection(values: dict[str, list[str]]) -> Selection:
    until = (values.get("until_ms") or [""])[0]
    refs = tuple(r.strip() for r in values.get("ref", []) if r.strip())
    if len(refs) > MAX_REFS:
        raise ConsoleError(400, f"at most {MAX_REFS} dead letters at once by id: use a filter")
    return Selection(refs, (values.get("capability") or [""])[0].strip(),
                     (values.get("reason") or [""])[0].strip(), (values.get("since") or [""])[0].strip(),
                     int(until) if until.isdigit() else None)


def _select(request: Request, selection: Selection) -> list[Target]:
    dlq = console_of(request.app).dead_letters()
    if selection.refs:
        return dlq.select(list(selection.refs))
    return dlq.select(f=selection.filter(dlq.now_ms()))  # (until_ms is set: never empty)


@router.get("/dlq")
async def dead_letters(request: Request, viewer: Reader,
                       capability: Annotated[str, Query(max_length=64)] = "",
                       reason: Annotated[str, Query(max_length=64)] = "",
                       since: Annotated[str, Query(max_length=32)] = "",
                       before: Annotated[str, Query(max_length=200)] = "",
                       done: Annotated[str, Query(max_length=20)] = "",
                       n: Annotated[int, Query(ge=0)] = 0) -> Response:
    gw = state_of(request.app)
    dlq = console_of(request.app).dead_letters()
    filters = {"capability": capability, "reason": reason, "since": since}

    def read(r: Any) -> tuple[Page, dict[str, int]]:
        f = Selection((), capability, reason, since, None).filter(dlq.now_ms())
        found = dlq.list(f, limit=PAGE, before=before or None)
        names = dlq.conn.capabilities()
        pipe = r.pipeline(transaction=False)
        for name in names:
            pipe.xlen(CapabilityKeys(gw.settings.prefix, name).dlq)
        return found, dict(zip(names, (int(x) for x in pipe.execute()), strict=True)) if names else {}

    try:
        found, totals = await gw.in_thread(read)
    except BadInput as exc:
        raise ConsoleError(400, str(exc)) from None
    kept = {k: v for k, v in filters.items() if v}
    next_url = (f"/console/dlq?{urlencode({**kept, 'before': found.next_before})}"
                if found.next_before else None)
    return page(request, viewer, "dlq.html", active="dlq", found=found, totals=totals, filters=filters,
                next_url=next_url, filter_query=urlencode(kept), done=done, n=n)


@router.get("/dlq/letter")
async def letter(request: Request, viewer: Reader, ref: Annotated[str, Query(max_length=200)]) -> Response:
    gw = state_of(request.app)
    dlq = console_of(request.app).dead_letters()
    detail = await gw.in_thread(lambda _: dlq.get(ref))
    return page(request, viewer, "dlq_letter.html", active="dlq", detail=detail, ref=ref,
                show_payloads=gw.settings.console_show_payloads)


@router.get("/dlq/confirm")
async def confirm(request: Request, viewer: Reader, action: Annotated[str, Query(max_length=10)]) -> Response:
    if action not in ACTIONS:
        raise ConsoleError(400, f"unknown action {action[:20]!r}")
    values: dict[str, list[str]] = {}
    for key, value in request.query_params.multi_items():
        values.setdefault(key, []).append(value)
    selection = _selection(values)
    dlq = console_of(request.app).dead_letters()
    if not selection.refs:  # (a filter: bounded by now, so the count shown is what it touches)
        selection = Selection((), selection.capability, selection.reason, selection.since,
                              await state_of(request.app).in_thread(lambda _: dlq.now_ms()) + 1)
    targets = await state_of(request.app).in_thread(lambda _: _select(request, selection))
    return page(request, viewer, "dlq_confirm.html", active="dlq", action=action, targets=targets,
                fields=selection.fields())


@router.post("/dlq/{action}")
async def act(request: Request, action: str) -> Response:
    form = await read_form(request)
    viewer = await checked_post(request, form)
    if action not in ACTIONS:
        raise ConsoleError(400, f"unknown action {action[:20]!r}")
    selection = _selection(form)
    if not selection.refs and selection.until_ms is None:
        raise ConsoleError(400, "confirm the selection first")
    dlq = console_of(request.app).dead_letters()

    def run() -> int:
        targets = _select(request, selection)
        if action == "replay":
            report = dlq.replay(targets, ReplayOptions(rate=REPLAY_RATE, max_queued=0))
            return report.done("replayed")
        return dlq.purge(targets).done("purged")

    done = await state_of(request.app).in_thread(lambda _: run())
    log.info("console: %s %s %d dead letter(s)", viewer.name, action, done)
    back = {k: v for k, v in (("capability", selection.capability), ("reason", selection.reason),
                              ("since", selection.since)) if v}
    return RedirectResponse(f"/console/dlq?{urlencode({**back, 'done': action, 'n': done})}", 303)
