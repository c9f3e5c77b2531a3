"""The console's forms: `application/x-www-form-urlencoded` bodies, read with a size limit."""

from __future__ import annotations

from urllib.parse import parse_qs

from fastapi import Request

from gateway.console.access import ConsoleError

MAX_FORM_BYTES = 256 * 1024
"""A form holds ids and filters, never payloads (a bulk selection of a thousand ids fits)."""


async def read_form(request: Request) -> dict[str, list[str]]:
    """The form's fields (an empty body is an empty form: no CSRF token, so refused after)."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise ConsoleError(413, f"the form is over {MAX_FORM_BYTES // 1024} KiB")
    if body and content_type != "application/x-www-form-urlencoded":
        raise ConsoleError(415, "send the form as application/x-www-form-urlencoded")
    try:
        return parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=5000)
    except (UnicodeDecodeError, ValueError):
        raise ConsoleError(400, "the form could not be read") from None


def field(form: dict[str, list[str]], name: str, default: str = "") -> str:
    values = form.get(name)
    return values[0].strip() if values else default
