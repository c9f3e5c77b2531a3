"""What a producer may ask for with a task, checked before anything is written, and submit.lua.

SubmitOptions is the one definition of the submit options: both clients, the CLI and the
intake reader build it, and build_submit_request turns it into a SubmitRequest (validated,
encoded) or raises the specific BadInput. SubmitFields is the same fields as keyword arguments
(a test holds the two to the same names).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, TypedDict

from broker import codec
from broker.errors import BadInput, InvalidPriority, QueueFull
from broker.ids import check_capability, new_local_id
from broker.keys import CapabilityKeys
from broker.protocol.cache import cached
from broker.protocol.calls import Arg, ScriptCall, Status, feed_args, wake_channel
from broker.protocol.packed_policy import FleetItems, policy_defaults
from broker.protocol.trace import given_trace, new_traceparent
from broker.settings import Settings
from broker.versions import parse_spec

MAX_LABEL_LEN = 256
START_GRACE_S = 60.0
"""A start time (`at`) this far in the past still queues the task at once (clocks differ); one
further back is refused."""


@dataclass(frozen=True, slots=True)
class SubmitOptions:
    """How a task is to be run; every field is optional."""

    priority: int = 5
    """0-9, higher first; a waiting task gains a level per aging_ms."""
    session_id: str | None = None
    """Keeps a conversation on the agent that served it while that agent is healthy."""
    region: str | None = None
    """Only agents of this region (or, with region_strict=False, preferably them)."""
    region_strict: bool = True
    version: str | None = None
    """A constraint on the agent's version: '2.3' (at least 2.3) or '>=2.3,<3'."""
    idempotency_key: str | None = None
    """A repeated key returns the first task's handle instead of making another."""
    timeout_s: float | None = None
    """Each attempt's execution timeout (default: the capability's, else default_timeout_ms)."""
    deadline_s: float | None = None
    """The whole task's budget, from submit to a terminal state."""
    max_attempts: int | None = None
    """Overrides the capability's max_attempts for this task."""
    traceparent: str | None = None
    """The W3C trace context the task runs in (default: the current OpenTelemetry span's when
    there is one, else a new trace)."""
    tracestate: str | None = None
    trace_id: str | None = None
    """A W3C trace id (32 hex) for a new traceparent in that trace (or the traceparent's own)."""
    metadata: dict[str, Any] | None = None
    """A JSON object handed to the handler as ctx.metadata."""
    delay_s: float | None = None
    """Scheduled: the task waits this long (by the Redis server clock) before it is queued."""
    at: datetime | None = None
    """Scheduled: the task is queued at this time (a timezone-aware datetime)."""


class SubmitFields(TypedDict, total=False):
    """SubmitOptions' fields as keyword arguments (`client.submit(cap, payload, priority=7)`)."""

    priority: int
    session_id: str | None
    region: str | None
    region_strict: bool
    version: str | None
    idempotency_key: str | None
    timeout_s: float | None
    deadline_s: float | None
    max_attempts: int | None
    traceparent: str | None
    tracestate: str | None
    trace_id: str | None
    metadata: dict[str, Any] | None
    delay_s: float | None
    at: datetime | None


OPTION_NAMES = tuple(f.name for f in fields(SubmitOptions))


def options_of(options: SubmitOptions | None, overrides: SubmitFields) -> SubmitOptions:
    """`options` (or the defaults) with the keyword arguments given on top."""
    unknown = set(overrides) - set(OPTION_NAMES)
    if unknown:
        raise BadInput(f"unknown submit option(s): {', '.join(sorted(unknown))}")
    base = options or SubmitOptions()
    if not overrides:
        return base
    values = {name: getattr(base, name) for name in OPTION_NAMES}
    values.update(overrides)
    return SubmitOptions(**values)


@dataclass(frozen=True, slots=True)
class SubmitRequest:
    """One validated task, ready to be written."""

    capability: str
    task_id: str
    local_id: str
    """The task id's part after the capability."""
    payload: str
    priority: int = 5
    session_id: str = ""
    region: str = ""
    idempotency_key: str = ""
    timeout_ms: int = 0
    """0: the capability's policy decides."""
    deadline_ms: int = 0
    trace: str = ""
    """The task's trace context as the record stores it (broker/protocol/trace.py)."""
    metadata: str = ""
    max_attempts: int = 0
    """0: the capability's policy decides."""
    routing: str = ""
    intake_entry: str = ""
    wait: bool = False
    """The producer will block on the task's done list (its outcome is pushed there)."""
    delay_ms: int = 0
    at_ms: int = 0

    def options_arg(self) -> str:
        """The options submit.lua reads from one argument: '' when none is set (the common
        case, which costs the script nothing), else a JSON object of text values."""
        given = {name: value for name, value in (
            ("session_id", self.session_id), ("region", self.region),
            ("idempotency_key", self.idempotency_key), ("metadata", self.metadata),
            ("routing", self.routing), ("intake_entry", self.intake_entry),
            ("timeout_ms", self.timeout_ms), ("deadline_ms", self.deadline_ms),
            ("max_attempts", self.max_attempts), ("delay_ms", self.delay_ms), ("at_ms", self.at_ms),
        ) if value}
        if not given:
            return ""
        return json.dumps({name: str(value) for name, value in given.items()}, separators=(",", ":"))


def _opt_text(name: str, value: object) -> str:
    if value is None:
        return ""
    if not isinstance(value, str) or not value or len(value) > MAX_LABEL_LEN:
        raise BadInput(f"{name} must be a non-empty string of at most {MAX_LABEL_LEN} characters")
    return value


def _opt_seconds(name: str, value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise BadInput(f"{name} must be a positive number of seconds, got {value!r}")
    if value > 10 * 365 * 86400:
        raise BadInput(f"{name} is more than ten years")
    return max(1, round(value * 1000))


def _check_numbers(options: SubmitOptions) -> None:
    priority, attempts = options.priority, options.max_attempts
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 9:
        raise InvalidPriority(f"priority must be an int from 0 to 9 (higher runs first), got {priority!r}")
    if attempts is not None and (
        isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= 100
    ):
        raise BadInput(f"max_attempts must be an int from 1 to 100, got {attempts!r}")


def _routing(options: SubmitOptions) -> str:
    routing: dict[str, Any] = {}
    if not options.region_strict:
        if options.region is None:
            raise BadInput("region_strict=False needs a region to prefer")
        routing["region_strict"] = False
    if options.version is not None:
        version = _opt_text("version", options.version)
        parse_spec(version)  # BadInput now rather than a task no agent can ever match
        routing["version"] = version
    return codec.dumps(routing) if routing else ""


def _start(options: SubmitOptions) -> tuple[int, int]:
    """(delay ms, start at ms) of a scheduled task; (0, 0) for one queued at once."""
    if options.delay_s is not None and options.at is not None:
        raise BadInput("give delay_s or at, not both")
    if options.at is not None:
        at = options.at
        if not isinstance(at, datetime) or at.tzinfo is None or at.utcoffset() is None:
            raise BadInput("at must be a timezone-aware datetime (e.g. datetime.now(UTC) + ...)")
        at_ms = round(at.timestamp() * 1000)
        if at_ms < (time.time() - START_GRACE_S) * 1000:
            raise BadInput(f"at {at.isoformat()} is in the past")
        if at_ms > (time.time() + 10 * 365 * 86400) * 1000:
            raise BadInput("at is more than ten years ahead")
        return 0, at_ms
    return _opt_seconds("delay_s", options.delay_s), 0


def _trace(options: SubmitOptions) -> str:
    given = given_trace(options.traceparent, options.tracestate, options.trace_id)
    return new_traceparent() if given is None else given.stored()


def build_submit_request(settings: Settings, capability: str, payload: Any,
                         options: SubmitOptions | None = None, *, intake_entry: str = "",
                         wait: bool = False) -> SubmitRequest:
    """Validate everything a producer passes; raise a specific BadInput before touching Redis."""
    options = options or SubmitOptions()
    check_capability(capability)
    _check_numbers(options)
    delay_ms, at_ms = _start(options)
    encoded = codec.encode_payload(payload, settings.max_payload_bytes, max_depth=settings.max_json_depth)
    meta = ""
    if options.metadata is not None:
        if not isinstance(options.metadata, dict):
            raise BadInput("metadata must be a JSON object (a dict with string keys)")
        meta = codec.encode_payload(options.metadata, settings.max_metadata_bytes, "metadata",
                                    settings.max_json_depth, "max_metadata_bytes")
    local_id = new_local_id()
    return SubmitRequest(
        capability=capability,
        task_id=f"{capability}:{local_id}",
        local_id=local_id,
        payload=encoded,
        priority=options.priority,
        session_id=_opt_text("session_id", options.session_id),
        region=_opt_text("region", options.region),
        idempotency_key=_opt_text("idempotency_key", options.idempotency_key),
        timeout_ms=_opt_seconds("timeout_s", options.timeout_s),
        deadline_ms=_opt_seconds("deadline_s", options.deadline_s),
        trace=_trace(options),
        metadata=meta,
        max_attempts=options.max_attempts or 0,
        routing=_routing(options),
        intake_entry=intake_entry,
        wait=wait,
        delay_ms=delay_ms,
        at_ms=at_ms,
    )


@dataclass(frozen=True, slots=True)
class _SubmitFrame:
    """What every submit call of one capability shares (built once per settings)."""

    keys: tuple[str, ...]
    args: tuple[Arg, ...]
    """The fixed arguments after the policy defaults."""
    task_prefix: str
    idempotency_prefix: str


def _frame(settings: Settings, capability: str) -> _SubmitFrame:
    ck = CapabilityKeys(settings.prefix, capability)
    maxlen, task_channels = feed_args(settings)
    return _SubmitFrame(
        (ck.queue, ck.events, ck.intake, ck.deadlines, ck.grants, ck.tokens, ck.stats, ck.granted,
         ck.policy, ck.rate, ck.delayed, ck.tasks),
        (settings.idempotency_ttl_ms, maxlen, task_channels, capability, ck.inbox_prefix,
         settings.cold_start_max_priority, wake_channel(settings)),
        ck.task(""), ck.idempotency(""))


def submit_call(settings: Settings, requests: Sequence[SubmitRequest], fleet: FleetItems = ()) -> ScriptCall:
    """`fleet`: the fleet's policy fields as the producer last read them (see policy_defaults)."""
    capability = requests[0].capability
    if any(r.capability != capability for r in requests):
        raise BadInput("one submit call serves one capability")
    frame = cached(settings, ("submit", capability), lambda: _frame(settings, capability))
    keys = list(frame.keys)
    args: list[Arg] = [policy_defaults(settings, capability, fleet), *frame.args]
    for r in requests:
        keys.append(frame.task_prefix + r.local_id)
        if r.idempotency_key:
            keys.append(frame.idempotency_prefix + r.idempotency_key)
        args += [r.task_id, r.local_id, r.payload, r.priority, r.trace, "1" if r.wait else "",
                 r.options_arg()]
    return ScriptCall("submit", keys, args)


def parse_submit(capability: str, limit: int, reply: list[Any]) -> list[tuple[str, bool]]:
    """[(task id, created)] in request order; QueueFull when the batch did not fit."""
    if reply and reply[0] == Status.FULL:
        raise QueueFull(capability, int(reply[1]), limit)
    return [(reply[i + 1], reply[i] == Status.NEW) for i in range(0, len(reply), 2)]
