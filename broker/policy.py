"""A capability's policy: the settings that decide how its tasks run, stored in Redis so that
every process of the fleet follows the same ones, whatever its own environment.

    max_attempts          attempts in all before a task fails into the DLQ
    timeout_ms            the default execution timeout of an attempt
    aging_ms              a waiting task gains a priority level per aging_ms
    max_queue_depth       submits beyond it are refused (QueueFull)
    retry_failures        an unclassified handler exception is retried instead of failed
    no_agent_timeout_ms   a task no agent started within it fails (no_agent_timeout; 0: never)
    rate, burst           at most `rate` task starts per second (token bucket `burst` deep; 0: no limit)
    max_running           at most this many tasks handed out at once, fleet-wide (0: no cap)
    paused, paused_reason nothing of the capability starts (submits still queue)

Each field's value is the capability's own (`reach policy set CAP`, or a dispatcher's
`[capabilities.CAP]` table), else the fleet's (`reach policy set --global`, or seeded from a
dispatcher's settings: its environment and reach.toml), else the built-in default. A
dispatcher seeds every field not yet set in Redis from its configuration, and copies the
fleet's values into each capability's hash, which is what the scripts read, at the moment it
matters (lua/_policy.lua). A producer's explicit per-task option still wins for that task.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from broker.errors import BadInput
from broker.settings import CapabilityConfig, Settings

# The fields' own defaults, read without the environment (model_construct trips on aliases in
# pydantic 2.7).
_BUILT_IN = {name: info.get_default(call_default_factory=True)
             for name, info in Settings.model_fields.items()}


@dataclass(frozen=True, slots=True)
class FieldSpec:
    name: str
    kind: type
    minimum: float = 0
    """Smallest value allowed (for numbers)."""
    strictly_above: bool = False

    def check(self, value: Any) -> Any:
        """The value in its kind, or BadInput naming the field."""
        label = self.name.replace("_", "-")
        if self.kind is bool:
            if not isinstance(value, bool):
                raise BadInput(f"--{label} must be true or false, got {value!r}")
            return value
        if self.kind is str:
            if not isinstance(value, str) or len(value) > 500:
                raise BadInput(f"--{label} must be text of at most 500 characters")
            return value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise BadInput(f"--{label} must be a number, got {value!r}")
        if self.kind is int and value != int(value):
            raise BadInput(f"--{label} must be a whole number, got {value!r}")
        low = value <= self.minimum if self.strictly_above else value < self.minimum
        if not math.isfinite(value) or low:
            bound = f"above {self.minimum:g}" if self.strictly_above else f"at least {self.minimum:g}"
            raise BadInput(f"--{label} must be {bound}, got {value!r}")
        return self.kind(value)


FIELDS: dict[str, FieldSpec] = {f.name: f for f in (
    FieldSpec("max_attempts", int, 1),
    FieldSpec("timeout_ms", int, 0, strictly_above=True),
    FieldSpec("aging_ms", int, 0, strictly_above=True),
    FieldSpec("max_queue_depth", int, 1),
    FieldSpec("retry_failures", bool),
    FieldSpec("no_agent_timeout_ms", int, 0),
    FieldSpec("rate", float, 0),
    FieldSpec("burst", int, 0),
    FieldSpec("max_running", int, 0),
    FieldSpec("paused", bool),
    FieldSpec("paused_reason", str),
)}


def built_in() -> dict[str, Any]:
    """The default of every field, as the code ships it."""
    return {**_from_settings(_BUILT_IN), "paused": False, "paused_reason": ""}


def _from_settings(values: Mapping[str, Any]) -> dict[str, Any]:
    return {"max_attempts": values["max_attempts"], "timeout_ms": values["default_timeout_ms"],
            "aging_ms": values["aging_ms"], "max_queue_depth": values["max_queue_depth"],
            "retry_failures": False, "no_agent_timeout_ms": values["no_agent_timeout_ms"],
            "rate": values["rate"], "burst": values["burst"], "max_running": values["max_running"]}


def configured(settings: Settings) -> dict[str, Any]:
    """The fleet-wide fields a process's settings give (environment, reach.toml globals)."""
    return _from_settings(settings.model_dump())


def configured_for(config: CapabilityConfig) -> dict[str, Any]:
    """The fields a `[capabilities.X]` table sets."""
    values = {"max_attempts": config.max_attempts, "timeout_ms": config.timeout_ms,
              "aging_ms": config.aging_ms, "max_queue_depth": config.max_queue_depth,
              "no_agent_timeout_ms": config.no_agent_timeout_ms, "rate": config.rate,
              "burst": config.burst, "max_running": config.max_running}
    out = {name: value for name, value in values.items() if value is not None}
    if config.retry_failures:
        out["retry_failures"] = True
    return out


def encode(name: str, value: Any) -> str:
    """A field's value as the hash keeps it (booleans '1' / '0')."""
    checked = FIELDS[name].check(value)
    if isinstance(checked, bool):
        return "1" if checked else "0"
    if isinstance(checked, float):
        return f"{checked:g}"
    return str(checked)


def decode(name: str, text: str | None) -> Any:
    """A field's value from the hash (None when absent or unreadable)."""
    if text is None:
        return None
    spec = FIELDS[name]
    try:
        if spec.kind is bool:
            return text == "1"
        if spec.kind is str:
            return text
        return spec.check(float(text) if spec.kind is float else int(text))
    except (ValueError, BadInput):
        return None


_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:/\s*(s|sec|second|m|min|minute|h|hour))?\s*$")
_PER = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60, "h": 3600, "hour": 3600}


def parse_rate(text: str) -> float:
    """Starts per second from `20/s`, `100/m`, `5000/h` or a bare number (per second)."""
    match = _RATE_RE.match(text)
    if not match:
        raise BadInput(f"--rate {text!r}: use a number per second, minute or hour, e.g. 20/s or 100/m")
    rate = float(match.group(1)) / _PER[match.group(2) or "s"]
    if rate <= 0:
        raise BadInput(f"--rate {text!r} must be above 0 (reset the field for no limit)")
    return rate


@dataclass(frozen=True, slots=True)
class Source:
    """Where a field's value came from."""

    kind: str
    """'default', 'config' (a dispatcher's settings) or 'set' (reach policy set / the API)."""
    by: str = ""
    """The dispatcher whose config it was, or who set it."""
    at_ms: int = 0
    scope: str = ""
    """'capability' or 'fleet' (for config and set)."""

    def encode(self) -> str:
        return f"{self.kind}|{self.by}|{self.at_ms}|{self.scope}"

    @classmethod
    def parse(cls, text: str | None) -> Source | None:
        parts = (text or "").split("|")
        if len(parts) != 4 or parts[0] not in ("config", "set"):
            return None
        return cls(parts[0], parts[1], int(parts[2]) if parts[2].isdigit() else 0, parts[3])

    def describe(self) -> str:
        if self.kind == "default":
            return "default"
        where = "" if self.scope == "capability" else " (fleet-wide)"
        if self.kind == "config":
            return f"config of {self.by}{where}"
        return f"set by {self.by}{where}"


DEFAULT_SOURCE = Source("default")


@dataclass(frozen=True)
class Policy:
    """A capability's effective policy, each field with where it came from."""

    capability: str | None
    """None for the fleet's defaults."""
    values: dict[str, Any]
    sources: dict[str, Source] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    @property
    def paused(self) -> bool:
        return bool(self.values["paused"])

    def burst_size(self) -> int:
        """The token bucket's depth (a burst of 0 means one second of the rate, at least 1)."""
        return int(self.values["burst"]) or max(1, math.ceil(float(self.values["rate"])))


def resolve(capability: str | None, own: Mapping[str, str], fleet: Mapping[str, str]) -> Policy:
    """The effective policy from the capability's hash (its own fields: `own:<field>`) and the
    fleet's hash. (For the fleet's defaults, `own` is the fleet's hash and `fleet` empty.)"""
    values, sources = built_in(), {name: DEFAULT_SOURCE for name in FIELDS}
    for name in FIELDS:
        for layer, is_own in ((fleet, False), (own, True)):
            if is_own and capability is not None and layer.get(f"own:{name}") != "1":
                continue
            value = decode(name, layer.get(name))
            if value is not None:
                values[name] = value
                sources[name] = Source.parse(layer.get(f"src:{name}")) or DEFAULT_SOURCE
    return Policy(capability, values, sources)


def fields_set(raw: Mapping[str, str]) -> dict[str, Any]:
    """The fields a policy hash sets, decoded (those that do not decode are left out)."""
    out = {}
    for name in FIELDS:
        value = decode(name, raw.get(name))
        if value is not None:
            out[name] = value
    return out
