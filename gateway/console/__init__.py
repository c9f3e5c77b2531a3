"""The operator console, served by the gateway at /console: Overview, Agents, Tasks, Task, Dead
letters, Schedules and Policy pages, live over Server-Sent Events.

    pages, dlq_pages, actions   the routes (read-only pages; dead letters; forms that act)
    access, session             who is looking (API keys, a signed HttpOnly cookie) and CSRF
    live, data                  what the pages show, read once per gateway for every open tab
    render, routing, forms      HTML: templates (autoescaped), headers, errors as pages
    templates/, static/         every asset the console uses (no CDN: it works offline)
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles

from gateway.console.console_state import ConsoleState, console_of
from gateway.state import state_of


def mount(app: FastAPI) -> None:
    """Serve the console on `app` (its state is made at once: it holds no connection yet)."""
    from gateway.console import actions, dlq_pages, pages

    app.state.console = ConsoleState(state_of(app))
    for router in (pages.router, dlq_pages.router, actions.router):
        app.include_router(router)
    app.mount("/console/static", StaticFiles(packages=[("gateway.console", "static")]),
              name="console-static")

    @app.get("/console/", include_in_schema=False)
    async def slash() -> RedirectResponse:
        return RedirectResponse("/console", 308)


async def close(app: FastAPI) -> None:
    await console_of(app).close()


__all__ = ["close", "mount"]
