"""Pages as HTML: the Jinja2 templates of gateway/console/templates (autoescaped: nothing a task
carries is ever rendered unescaped), the filters they use, and the headers every console answer
carries (a strict Content-Security-Policy: scripts and styles only from the console's own
files, no inline script, no framing)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape

from gateway.console import session as sessions
from gateway.console.access import Viewer

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
                               "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; "
                               "form-action 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
TRUNCATE_AT = 4000
"""Characters of a payload or result a page shows (the rest is cut, and says so)."""

PAGES = [("overview", "Overview", "/console"), ("agents", "Agents", "/console/agents"),
         ("tasks", "Tasks", "/console/tasks"), ("dlq", "Dead letters", "/console/dlq"),
         ("schedules", "Schedules", "/console/schedules"), ("policy", "Policy", "/console/policy")]


def ago(seconds: float | None) -> str:
    """A duration as people read it: 4s, 3m 20s, 2h 5m, 3d 4h."""
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def clock(value: datetime | int | float | None, ms: bool = True) -> str:
    """A time (a datetime or ms) as UTC `MM-DD HH:MM:SS.mmm` (without the ms: `ms=False`)."""
    if value is None or value == 0:
        return "-"
    when = value if isinstance(value, datetime) else datetime.fromtimestamp(float(value) / 1000, UTC)
    text = when.astimezone(UTC).strftime("%m-%d %H:%M:%S")
    return f"{text}.{when.microsecond // 1000:03d}" if ms else text


def shown(value: Any, limit: int = TRUNCATE_AT) -> tuple[str, int]:
    """(text, characters cut): JSON pretty-printed, cut at `limit`."""
    text = value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False)
    return (text[:limit], len(text) - limit) if len(text) > limit else (text, 0)


def spark_points(values: list[int], width: int = 120, height: int = 24) -> str:
    """An SVG polyline's points for a sparkline of `values` (scaled to the largest)."""
    top = max(max(values), 1)
    step = width / max(len(values) - 1, 1)
    return " ".join(f"{i * step:.1f},{height - 1 - v * (height - 2) / top:.1f}" for i, v in enumerate(values))


def jsonish(value: Any) -> str:
    """A value as JSON shows it (true, not True), a string as itself."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _environment() -> Environment:
    env = Environment(loader=PackageLoader("gateway.console", "templates"),
                      autoescape=select_autoescape(default=True), trim_blocks=True, lstrip_blocks=True)
    env.filters.update(ago=ago, clock=clock, percent=percent, jsonish=jsonish)
    env.globals.update(pages=PAGES, shown=shown, spark_points=spark_points)
    return env


ENV = _environment()


def render(name: str, **context: Any) -> str:
    return ENV.get_template(name).render(**context)


def page(request: Request, viewer: Viewer | None, name: str, status: int = 200, **context: Any) -> Response:
    """A page (the console's route class adds its headers and cookie: routing.py)."""
    html = render(name, viewer=viewer, path=request.url.path, **context)
    return HTMLResponse(html, status)


def finish(request: Request, response: Response, viewer: Viewer | None) -> Response:
    """The console's headers, and the session cookie when the viewer got a new one."""
    response.headers.update(SECURITY_HEADERS)
    if viewer is not None and viewer.new_cookie is not None:
        set_session(request, response, viewer.new_cookie)
    return response


def set_session(request: Request, response: Response, value: str | None) -> None:
    """Set (or, with None, end) the session cookie: HttpOnly, SameSite=Strict, Secure over HTTPS."""
    if value is None:
        response.delete_cookie(sessions.COOKIE, path="/console", httponly=True, samesite="strict")
        return
    response.set_cookie(sessions.COOKIE, value, max_age=sessions.SESSION_TTL_S, path="/console",
                        httponly=True, samesite="strict", secure=request.url.scheme == "https")
