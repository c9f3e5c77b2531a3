"""Durations as operators type them: `500ms`, `30s`, `15m`, `2h`, `7d`, `1w` or sums of those
(`1h30m`), in milliseconds (pure)."""

from __future__ import annotations

import re

from broker.errors import BadInput

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_PART_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_DURATION_RE = re.compile(r"^(?:\d+(?:\.\d+)?(?:ms|s|m|h|d|w))+\Z")
MAX_DURATION_MS = 100 * 365 * 86_400_000


def parse_duration_ms(text: str, what: str = "duration") -> int:
    """`90s`, `15m`, `2h`, `7d`, `1h30m` ... as milliseconds; BadInput naming `what` else."""
    compact = text.strip().lower().replace(" ", "")
    if not _DURATION_RE.match(compact):
        raise BadInput(f"invalid {what} {text!r}: use e.g. 30s, 15m, 2h, 7d or 1h30m")
    total = sum(float(n) * _UNITS_MS[unit] for n, unit in _PART_RE.findall(compact))
    if total <= 0 or total > MAX_DURATION_MS:
        raise BadInput(f"invalid {what} {text!r}: must be more than 0 and at most 100 years")
    return round(total)
