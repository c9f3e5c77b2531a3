"""What an A2A request asks of Reach beyond its message (pure functions): the capability, the
submit options, and where a subscriber resumes.

    skill            the endpoint's capability (/a2a/agents/<capability>); on the fleet's
                     endpoint, the request's or the message's metadata {"skill": "<capability>"}
    metadata.reach   optional submit options: priority, timeout_s, deadline_s, region
    Last-Event-ID    SubscribeToTask resumes after this event (metadata.reach.seq of the last
                     event the client got)
"""

from __future__ import annotations

from typing import Any

from a2a.server.context import ServerCallContext
from a2a.types import SendMessageRequest
from a2a.utils.errors import InvalidParamsError
from google.protobuf.json_format import MessageToDict

from broker.codec import whole_numbers
from broker.protocol.submit import MAX_LABEL_LEN, SubmitOptions

_OPTIONS = {"priority": int, "timeout_s": float, "deadline_s": float, "region": str}
MAX_SEQ_DIGITS = 12


def _metadata(params: SendMessageRequest) -> dict[str, Any]:
    """The request's metadata over the message's (both may say it)."""
    out: dict[str, Any] = whole_numbers(MessageToDict(params.message.metadata))
    out.update(whole_numbers(MessageToDict(params.metadata)))
    return out


def requested_capability(params: SendMessageRequest, context: ServerCallContext, live: list[str]) -> str:
    meta = _metadata(params)
    named = meta.get("skill")
    endpoint = context.state.get("capability")
    if endpoint:
        if named is not None and named != endpoint:
            raise InvalidParamsError(f"this endpoint serves the skill {endpoint!r}, not {named!r}")
        return str(endpoint)
    if not isinstance(named, str) or not named:
        raise InvalidParamsError('name the skill: metadata {"skill": "<capability>"} (one of '
                                 f"{', '.join(live) or 'none yet'}), or send to /a2a/agents/<capability>")
    return named


def submit_options(params: SendMessageRequest, context_id: str, a2a: dict[str, Any],
                   idempotency_key: str | None) -> SubmitOptions:
    if len(context_id) > MAX_LABEL_LEN:
        raise InvalidParamsError(f"contextId is longer than {MAX_LABEL_LEN} characters")
    given = _metadata(params).get("reach") or {}
    if not isinstance(given, dict):
        raise InvalidParamsError('metadata "reach" must be an object of submit options')
    fields: dict[str, Any] = {}
    for name, value in given.items():
        kind = _OPTIONS.get(name)
        if kind is None:
            raise InvalidParamsError(f'metadata "reach" has {name!r}: the options are {", ".join(_OPTIONS)}')
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not (isinstance(value, str) if kind is str else number):
            raise InvalidParamsError(f'metadata "reach".{name} must be a {kind.__name__}')
        fields[name] = kind(value)
    return SubmitOptions(session_id=context_id, metadata={"a2a": a2a}, idempotency_key=idempotency_key,
                         **fields)


def resume_point(context: ServerCallContext) -> int | None:
    """The event a subscriber got last (its `Last-Event-ID` header), if it says."""
    headers = context.state.get("headers") or {}
    text = str(headers.get("last-event-id") or "").strip()
    if not text:
        return None
    if not (text.isascii() and text.isdigit()) or len(text) > MAX_SEQ_DIGITS:  # ('²' is a digit)
        raise InvalidParamsError(f"Last-Event-ID must be an event's sequence number (metadata.reach.seq), "
                                 f"got {text[:40]!r}")
    return int(text)
