"""Tasks written straight to a capability's intake stream by producers without our client.

The wire format, one stream entry per task (XADD <prefix>:{<cap>}:intake * field value ...):

    payload         JSON text (required)
    priority        0-9 (default 5)
    session_id, region, idempotency_key                text (optional)
    traceparent, tracestate                            W3C trace context (optional)
    trace_id                                           a W3C trace id, 32 hex (optional)
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

import logging
import time
from typing import Any

import redis

from broker import codec, limits
from broker.errors import BadInput, NestedTooDeep, QueueFull
from broker.keys import DISPATCH_GROUP, CapabilityKeys
from broker.protocol.lifecycle import dead_letter_raw_call
from broker.protocol.submit import (
    SubmitOptions,
    SubmitRequest,
    build_submit_request,
    parse_submit,
    submit_call,
)
from broker.settings import Settings
from dispatcher.context import DispatcherContext

log = logging.getLogger("reach.dispatcher")

INTAKE_BATCH = 200
INTAKE_CLAIM_IDLE_MS = 60_000


def _number(fields: dict[str, str], name: str, kind: type[int] | type[float]) -> Any:
    text = fields.get(name)
    if text is None or text == "":
        return None
    try:
        return kind(text)
    except ValueError:
        raise BadInput(f"{name} must be a number, got {text!r}") from None


def _json_field(fields: dict[str, str], name: str, max_depth: int) -> Any:
    text = fields[name]
    if limits.nests_deeper(text, max_depth):  # (refused before it is parsed, however deep)
        raise NestedTooDeep(f"{name} is nested too deeply to parse ({limits.nesting_depth(text)} "
                            f"levels; max_json_depth is {max_depth})")
    try:
        return codec.loads(text)
    except ValueError as exc:
        raise BadInput(f"{name} is not strict JSON: {exc}") from None


def parse_intake_entry(settings: Settings, capability: str, entry_id: str,
                       fields: dict[str, str]) -> SubmitRequest:
    """A validated submit request for one intake entry, or BadInput saying what is wrong."""
    # Fields this version does not know are ignored: a newer producer may add some.
    if "payload" not in fields:
        raise BadInput("no payload field")
    for name, value in fields.items():
        if any("\udc80" <= ch <= "\udcff" for ch in value):
            raise BadInput(f"field {name} is not UTF-8 text")
    payload = _json_field(fields, "payload", settings.max_json_depth)
    metadata = _json_field(fields, "metadata", settings.max_json_depth) if fields.get("metadata") else None
    priority = _number(fields, "priority", int)
    options = SubmitOptions(
        priority=5 if priority is None else priority,
        session_id=fields.get("session_id") or None,
        region=fields.get("region") or None,
        idempotency_key=fields.get("idempotency_key") or None,
        timeout_s=_number(fields, "timeout_s", float),
        deadline_s=_number(fields, "deadline_s", float),
        traceparent=fields.get("traceparent") or None,
        tracestate=fields.get("tracestate") or None,
        trace_id=fields.get("trace_id") or None,
        metadata=metadata,
        max_attempts=_number(fields, "max_attempts", int),
    )
    return build_submit_request(settings, capability, payload, options, intake_entry=entry_id)


class IntakeReader:
    """One dispatcher's reading of one capability's intake stream, through the group
    `dispatch`: its own unfinished entries first (a QueueFull earlier, or a restart), then new
    ones, and now and then the entries a dispatcher that died had read and never finished."""

    def __init__(self, ctx: DispatcherContext, capability: str) -> None:
        self.ctx = ctx
        self.capability = capability
        self.stream = CapabilityKeys(ctx.settings.prefix, capability).intake
        self._group_ready = False
        self._pending_checked = False
        self._next_claim = 0.0

    async def take(self) -> int:
        """Turn a batch of entries into tasks (or dead letters); returns how many it handled."""
        r = self.ctx.redis
        stream = self.stream
        if not self._group_ready:
            try:
                await r.xgroup_create(stream, DISPATCH_GROUP, id="0", mkstream=True)
            except redis.exceptions.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
            self._group_ready = True
        # First our own unfinished entries (a QueueFull earlier, or a restart), then new ones.
        start = ">" if self._pending_checked else "0"
        reply: Any = await r.xreadgroup(DISPATCH_GROUP, self.ctx.dispatcher_id, {stream: start},
                                        count=INTAKE_BATCH)
        entries: list[Any] = reply[0][1] if reply else []
        if start == "0" and len(entries) < INTAKE_BATCH:
            self._pending_checked = True
        if not entries and start == ">" and time.monotonic() >= self._next_claim:
            self._next_claim = time.monotonic() + INTAKE_CLAIM_IDLE_MS / 3000
            entries = await self._claim_abandoned()
        if not entries:
            return 0
        requests = []
        for entry_id, fields in entries:
            if fields is None:  # deleted while pending
                await r.xack(stream, DISPATCH_GROUP, entry_id)
                continue
            try:
                requests.append(parse_intake_entry(self.ctx.settings, self.capability, entry_id, fields))
            except Exception as exc:  # (BadInput, or anything else a stranger's entry provokes:
                # one bad entry must not hold back the good ones read with it)
                if isinstance(exc, BadInput):
                    log.warning("%s: malformed intake entry %s: %s", self.capability, entry_id, exc)
                else:
                    log.exception("%s: intake entry %s could not be read", self.capability, entry_id)
                await self.ctx.scripts(dead_letter_raw_call(
                    self.ctx.settings, self.capability, stream, DISPATCH_GROUP, entry_id,
                    "malformed", str(exc), fields))
        if requests:
            try:
                parse_submit(self.capability, self.ctx.settings.max_queue_depth,
                             await self.ctx.scripts(submit_call(self.ctx.settings, requests)))
            except QueueFull as exc:
                log.warning("%s: %s; intake entries wait", self.capability, exc)
                self._pending_checked = False
                return 0
        return len(entries)

    async def _claim_abandoned(self) -> list[Any]:
        """Entries another dispatcher read and never finished (it died): take them over."""
        reply = await self.ctx.redis.xautoclaim(
            self.stream, DISPATCH_GROUP, self.ctx.dispatcher_id, INTAKE_CLAIM_IDLE_MS,
            start_id="0-0", count=INTAKE_BATCH)
        entries: list[Any] = reply[1] if reply else []
        return [e for e in entries if e]
