"""Tasks written straight to a capability's intake stream by producers without our client.

The wire format, one stream entry per task (XADD <prefix>:{<cap>}:intake * field value ...):

    payload         JSON text (required)
    priority        0-9 (default 5)
    session_id, region, idempotency_key, trace_id      text (optional)
    timeout_s, deadline_s                              seconds (optional)
    metadata        JSON object text (optional)
    max_attempts    1-100 (optional)

The dispatcher reads the stream through the consumer group `dispatch`, validates each entry and
creates the task in the same script call that acknowledges and deletes the entry (a crash in
between can neither lose nor duplicate it). An entry that is not valid goes to the capability's
dead-letter stream with reason `malformed`, its raw fields kept. To be picked up at once rather
than at the next idle tick, PUBLISH "<prefix>:wake" "task <cap>" after the XADD.
"""

from __future__ import annotations

from typing import Any

from broker import codec, protocol
from broker.errors import BadInput
from broker.settings import Settings


def _number(fields: dict[str, str], name: str, kind: type[int] | type[float]) -> Any:
    text = fields.get(name)
    if text is None or text == "":
        return None
    try:
        return kind(text)
    except ValueError:
        raise BadInput(f"{name} must be a number, got {text!r}") from None


def _json_field(fields: dict[str, str], name: str) -> Any:
    try:
        return codec.loads(fields[name])
    except ValueError as exc:
        raise BadInput(f"{name} is not strict JSON: {exc}") from None
    except RecursionError:
        raise BadInput(f"{name} is nested too deeply to parse") from None


def parse_intake_entry(settings: Settings, capability: str, entry_id: str,
                       fields: dict[str, str]) -> protocol.SubmitRequest:
    """A validated submit request for one intake entry, or BadInput saying what is wrong."""
    # Fields this version does not know are ignored: a newer producer may add some.
    if "payload" not in fields:
        raise BadInput("no payload field")
    for name, value in fields.items():
        if any("\udc80" <= ch <= "\udcff" for ch in value):
            raise BadInput(f"field {name} is not UTF-8 text")
    payload = _json_field(fields, "payload")
    metadata = _json_field(fields, "metadata") if fields.get("metadata") else None
    priority = _number(fields, "priority", int)
    return protocol.build_submit_request(
        settings, capability, payload,
        priority=5 if priority is None else priority,
        session_id=fields.get("session_id") or None,
        region=fields.get("region") or None,
        idempotency_key=fields.get("idempotency_key") or None,
        timeout_s=_number(fields, "timeout_s", float),
        deadline_s=_number(fields, "deadline_s", float),
        trace_id=fields.get("trace_id") or None,
        metadata=metadata,
        max_attempts=_number(fields, "max_attempts", int),
        intake_entry=entry_id,
    )
