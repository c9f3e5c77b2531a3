"""A task's W3C trace context (https://www.w3.org/TR/trace-context/): checked, made, stored.

The task record keeps it in one field, `trace`: the traceparent (always version 00, 55
characters), then, when the producer gave one, a space and the tracestate. The trace id readers
see is the traceparent's (characters 3 to 35), derived here and, where a script must show it,
by trace_id_of in lua/_events.lua.

Making one costs one getrandbits call and one format: submit is a hot path.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from broker.errors import BadInput

TRACEPARENT_LEN = 55
MAX_TRACESTATE_LEN = 512
MAX_TRACESTATE_MEMBERS = 32
_MASK64 = (1 << 64) - 1

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_TRACE_ID = re.compile(r"[0-9a-f]{32}|[0-9a-f]{16}")
_TS_KEY = r"(?:[a-z][a-z0-9_\-*/]{0,255}|[a-z0-9][a-z0-9_\-*/]{0,240}@[a-z][a-z0-9_\-*/]{0,13})"
_TS_VALUE = r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
_TS_MEMBER = re.compile(f"{_TS_KEY}={_TS_VALUE}")


@dataclass(frozen=True, slots=True)
class TraceContext:
    traceparent: str
    tracestate: str = ""

    @property
    def trace_id(self) -> str:
        return self.traceparent[3:35]

    @property
    def span_id(self) -> str:
        return self.traceparent[36:52]

    def stored(self) -> str:
        """The record's `trace` field."""
        return f"{self.traceparent} {self.tracestate}" if self.tracestate else self.traceparent


def new_traceparent(trace_id: str | None = None) -> str:
    """A sampled traceparent with a new parent id (and a new trace id unless given)."""
    n = random.getrandbits(192)
    span = n & _MASK64 or 1
    if trace_id is None:
        trace = n >> 64 or 1  # (all zeros is invalid; a 2**-128 chance)
        return f"00-{trace:032x}-{span:016x}-01"
    return f"00-{trace_id}-{span:016x}-01"


def check_traceparent(value: object, field: str = "traceparent") -> str:
    """The traceparent as stored (version 00), or BadInput naming `field` and what is wrong."""
    if not isinstance(value, str):
        raise BadInput(f"{field} must be a string, got {type(value).__name__}")
    m = _TRACEPARENT.match(value)
    if m is None:
        raise BadInput(f"{field} must be a W3C traceparent '00-<32 hex>-<16 hex>-<2 hex>' "
                       f"(lowercase), got {value[:80]!r}")
    version, trace, parent, flags = m.groups()
    if version == "ff":
        raise BadInput(f"{field} has the invalid version ff")
    if version == "00" and len(value) != TRACEPARENT_LEN:
        raise BadInput(f"{field} of version 00 must be {TRACEPARENT_LEN} characters, got {len(value)}")
    if len(value) > TRACEPARENT_LEN and value[TRACEPARENT_LEN] != "-":
        raise BadInput(f"{field} has trailing characters after its flags")
    if trace == "0" * 32:
        raise BadInput(f"{field} has an all-zero trace id")
    if parent == "0" * 16:
        raise BadInput(f"{field} has an all-zero parent id")
    # (a later version is read as version 00, and sent on as one, as the spec asks)
    return f"00-{trace}-{parent}-{flags}"


def check_tracestate(value: object, field: str = "tracestate") -> str:
    """The tracestate without blank members, or BadInput naming `field`."""
    if not isinstance(value, str):
        raise BadInput(f"{field} must be a string, got {type(value).__name__}")
    if len(value) > MAX_TRACESTATE_LEN:
        raise BadInput(f"{field} is longer than {MAX_TRACESTATE_LEN} characters")
    members = [m.strip(" \t") for m in value.split(",")]
    members = [m for m in members if m]
    if len(members) > MAX_TRACESTATE_MEMBERS:
        raise BadInput(f"{field} has more than {MAX_TRACESTATE_MEMBERS} members")
    keys = set()
    for member in members:
        if _TS_MEMBER.fullmatch(member) is None:
            raise BadInput(f"{field} member {member[:80]!r} is not key=value as W3C tracestate has it")
        key = member.split("=", 1)[0]
        if key in keys:
            raise BadInput(f"{field} names {key!r} twice")
        keys.add(key)
    return ",".join(members)


def check_trace_id(value: object, field: str = "trace_id") -> str:
    """A W3C trace id (32 lowercase hex); a 64-bit one (16 hex) is left-padded with zeros."""
    if not isinstance(value, str) or _TRACE_ID.fullmatch(value) is None:
        raise BadInput(f"{field} must be a W3C trace id (32 lowercase hex digits), got {value!r}")
    if len(value) == 16:
        value = "0" * 16 + value
    if value == "0" * 32:
        raise BadInput(f"{field} is all zeros")
    return value


def trace_filter(value: object, field: str) -> str:
    """The trace id a search asks for: a trace id, or a traceparent (its trace id)."""
    if isinstance(value, str) and len(value) >= TRACEPARENT_LEN:
        return check_traceparent(value, field)[3:35]
    return check_trace_id(value, field)


def given_trace(traceparent: str | None, tracestate: str | None,
                trace_id: str | None) -> TraceContext | None:
    """The trace context a producer passed (None: none), checked; BadInput when bad."""
    if traceparent is None:
        if tracestate is not None:
            raise BadInput("tracestate needs a traceparent")
        if trace_id is None:
            return None
        return TraceContext(new_traceparent(check_trace_id(trace_id)))
    context = TraceContext(check_traceparent(traceparent),
                           "" if tracestate is None else check_tracestate(tracestate))
    if trace_id is not None and check_trace_id(trace_id) != context.trace_id:
        raise BadInput("trace_id and traceparent name different traces")
    return context


def parse_stored(value: str | None) -> TraceContext | None:
    """The record's `trace` field as a TraceContext (None when it holds none)."""
    if not value or len(value) < TRACEPARENT_LEN or value[2] != "-":
        return None
    return TraceContext(value[:TRACEPARENT_LEN], value[TRACEPARENT_LEN + 1:])


def trace_id_of(value: str | None) -> str | None:
    """The trace id the record's `trace` field holds (None when it holds none)."""
    if not value or len(value) < TRACEPARENT_LEN or value[2] != "-":
        return None
    return value[3:35]
