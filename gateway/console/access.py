"""Who is looking at the console, and what they may do.

    open console       no key is needed (a loopback gateway while no key exists, or
                       `--insecure-no-auth`): everyone is an operator
    operator key       sees everything and gets the action buttons (cancel, replay, purge, pause)
    reader, producer   a read-only view: no action buttons, and every action is refused (403)
    nobody             is sent to the login form

Every POST must carry the session's CSRF token (gateway/console/session.py), the login form's
too; a POST without it, or with another session's, is refused with 403 and changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

from fastapi import Request

from gateway.apikeys import AuthMode, KeyRecord, Role
from gateway.console import session as sessions
from gateway.console.session import Session
from gateway.state import state_of


class LoginNeeded(Exception):
    """A page that needs a logged-in viewer: the login form, then back (`next`)."""

    def __init__(self, next_url: str) -> None:
        super().__init__(next_url)
        self.next_url = next_url


class ConsoleError(Exception):
    """An error page: the status and a message for the viewer (never a secret)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(slots=True)
class Viewer:
    session: Session
    csrf: str
    role: Role | None
    """None: not logged in (and a key is needed)."""
    name: str
    open: bool
    new_cookie: str | None = None
    """A session to set on the response (a first visit, or a cookie that no longer holds)."""

    @property
    def can_act(self) -> bool:
        return self.role is Role.OPERATOR

    @property
    def logged_in(self) -> bool:
        return self.role is not None


def _record_by_id(keys: dict[str, KeyRecord], key_id: str) -> tuple[str, KeyRecord] | None:
    for sha, record in keys.items():
        if record.id == key_id:
            return sha, record
    return None


async def viewer_of(request: Request) -> Viewer:
    """The viewer of a request, from its session cookie (a new anonymous session if it has none
    that holds). Cached on the request."""
    cached = getattr(request.state, "console_viewer", None)
    if isinstance(cached, Viewer):
        return cached
    gw = state_of(request.app)
    secret = await request.app.state.console.secret.get()
    keys = await gw.auth.cache.keys() if gw.auth.mode is not AuthMode.OFF else {}
    is_open = gw.auth.mode is AuthMode.OFF or (gw.auth.mode is AuthMode.AUTO and not keys)
    session, record, new_cookie = None, None, None
    decoded = sessions.decode(request.cookies.get(sessions.COOKIE))
    if decoded is not None:
        candidate, mac = decoded
        if candidate.anonymous:
            session = candidate if sessions.check(secret, candidate, mac) else None
        elif (found := _record_by_id(keys, candidate.key_id)) is not None:
            sha, record = found
            session = candidate if sessions.check(secret, candidate, mac, sha) else None
            record = record if session is not None else None
    if session is None:
        session = sessions.new_session()
        new_cookie = sessions.encode(secret, session)
    role: Role | None
    if is_open:
        role, name = Role.OPERATOR, "open console"
    elif record is not None:
        role, name = record.role, record.name or f"key {record.id}"
    else:
        role, name = None, ""
    viewer = Viewer(session, sessions.csrf_token(secret, session), role, name, is_open, new_cookie)
    request.state.console_viewer = viewer
    return viewer


async def reader(request: Request) -> Viewer:
    """The viewer of a page: anyone logged in (else LoginNeeded)."""
    viewer = await viewer_of(request)
    if not viewer.logged_in:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise LoginNeeded(target)
    return viewer


async def checked_post(request: Request, form: dict[str, list[str]], *, operator: bool = True) -> Viewer:
    """The viewer of a POST: the form must carry the session's CSRF token (else 403), and an
    action needs an operator (else 403; nobody logged in: the login form)."""
    viewer = await viewer_of(request)
    secret = await request.app.state.console.secret.get()
    token = (form.get("csrf") or [""])[0]
    if viewer.new_cookie is not None or not sessions.csrf_ok(secret, viewer.session, token):
        raise ConsoleError(403, "This form has expired or did not come from this console "
                                "(no valid CSRF token). Reload the page and try again.")
    if operator:
        if not viewer.logged_in:
            raise LoginNeeded("/console")
        if not viewer.can_act:
            raise ConsoleError(403, f"A {viewer.role.value if viewer.role else 'reader'} key has a "
                                    "read-only view: actions need an operator key.")
    return viewer


def login_url(next_url: str) -> str:
    return f"/console/login?next={quote(next_url, safe='')}"
