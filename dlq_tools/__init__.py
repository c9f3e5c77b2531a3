"""Inspecting and replaying the dead-letter stream (library + `reach dlq` commands).

    from dlq_tools import DeadLetters, Filter, ReplayOptions
    with DeadLetters(settings) as dlq:
        for letter in dlq.list(Filter(reason="failure")).items: ...
        dlq.get("summarize:01J...")                    # record, payload, attempts, events
        dlq.replay(dlq.select(["summarize:01J..."]), ReplayOptions(rate=20))
        dlq.purge(dlq.select(f=Filter(reason="invalid_request")))
        dlq.stats()

`trim(client, settings, capability)` applies the retention (dlq_retention_ms, dlq_maxlen).
Operator documentation, including every `--json` field: docs/dlq.md.
"""

from broker.durations import parse_duration_ms
from broker.retention import trim, trim_all
from dlq_tools.api import DeadLetters, Page
from dlq_tools.history import Attempt, attempts_from_history
from dlq_tools.models import (
    DeadLetter,
    DeadLetterDetail,
    Filter,
    Outcome,
    Report,
    Target,
    UnknownDeadLetter,
)
from dlq_tools.parsing import Ref, parse_ref, parse_time_ms
from dlq_tools.replay import Pacer, ReplayOptions
from dlq_tools.stats import Stats
from dlq_tools.transfer import ImportResult

__all__ = [
    "Attempt",
    "DeadLetter",
    "DeadLetterDetail",
    "DeadLetters",
    "Filter",
    "ImportResult",
    "Outcome",
    "Pacer",
    "Page",
    "Ref",
    "ReplayOptions",
    "Report",
    "Stats",
    "Target",
    "UnknownDeadLetter",
    "attempts_from_history",
    "parse_duration_ms",
    "parse_ref",
    "parse_time_ms",
    "trim",
    "trim_all",
]
