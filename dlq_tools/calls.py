"""Typed calls of the dead-letter scripts (`broker/lua/dlq_*.lua`): argument layout and replies.

Pure, like `broker/protocol/`: each builder returns the KEYS and ARGV lists its script's
header documents, each parser turns the reply into Python values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from broker.errors import BadInput
from broker.ids import split_task_id
from broker.keys import CapabilityKeys
from broker.protocol.calls import ScriptCall, feed_args, wake_channel
from broker.protocol.packed_policy import policy_defaults
from broker.settings import Settings
from dlq_tools.models import Filter

Mode = Literal["ids", "summary", "full"]


@dataclass(frozen=True, slots=True)
class ScanPage:
    cursor: str
    """The last entry id examined ('' once the range is exhausted)."""
    examined: int
    matches: list[tuple[str, dict[str, str]]]


def scan_call(
    settings: Settings, capability: str, f: Filter, *, newest_first: bool, start: str, end: str,
    budget: int, want: int, mode: Mode, task_id: str = "",
) -> ScriptCall:
    return ScriptCall(
        "dlq_scan",
        [CapabilityKeys(settings.prefix, capability).dlq],
        ["rev" if newest_first else "fwd", start, end, budget, want, f.reason or "", f.agent or "",
         task_id, f.since_ms or 0, f.until_ms or 0, mode],
    )


def parse_scan(reply: list[Any]) -> ScanPage:
    matches = []
    for entry_id, flat in reply[2:]:
        matches.append((str(entry_id), {str(flat[i]): str(flat[i + 1]) for i in range(0, len(flat), 2)}))
    return ScanPage(str(reply[0]), int(reply[1]), matches)


@dataclass(slots=True)
class StatsPage:
    cursor: str
    examined: int
    oldest_ms: int
    newest_ms: int
    reasons: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)


def stats_call(settings: Settings, capability: str, start: str, budget: int, cut: int) -> ScriptCall:
    return ScriptCall("dlq_stats", [CapabilityKeys(settings.prefix, capability).dlq], [start, budget, cut])


def parse_stats(reply: list[Any]) -> StatsPage:
    def pairs(flat: list[Any]) -> dict[str, int]:
        return {str(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)}

    return StatsPage(str(reply[0]), int(reply[1]), int(reply[2]), int(reply[3]), pairs(reply[4]),
                     pairs(reply[5]))


@dataclass(frozen=True, slots=True)
class ReplayItem:
    entry_id: str
    task_id: str
    history: str
    """The entry's events as JSON texts joined by newlines (rebuilds the events of an expired
    record)."""


def replay_call(
    settings: Settings, capability: str, items: Sequence[ReplayItem], *, priority: int | None,
    reset_attempts: bool,
) -> ScriptCall:
    ck = CapabilityKeys(settings.prefix, capability)
    keys = [ck.dlq, ck.queue, ck.events, ck.deadlines, ck.policy, ck.tasks]
    args: list[str | int | float] = [
        policy_defaults(settings, capability), *feed_args(settings), capability, "",
        "" if priority is None else priority, "1" if reset_attempts else "0", wake_channel(settings),
    ]
    for item in items:
        cap, local = split_task_id(item.task_id)
        if cap != capability:
            raise BadInput(f"task {item.task_id} is not in capability {capability!r}")
        keys.append(ck.task(local))
        args += [item.entry_id, item.task_id, local, item.history]
    return ScriptCall("dlq_replay", keys, args)


def parse_replay(reply: list[Any]) -> list[tuple[str, str]]:
    """(status, detail) per item, in order."""
    return [(str(reply[i]), str(reply[i + 1])) for i in range(0, len(reply), 2)]
