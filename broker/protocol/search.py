"""The scripts a task search calls (broker/ops/search.py): their arguments and replies.

    task_rows   records of one capability's tasks, filtered on the server (lua/task_rows.lua)
    dlq page    the task ids of a run of dead letters, newest first (lua/dlq_scan.lua, 'ids')
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from broker.keys import CapabilityKeys
from broker.protocol.calls import ScriptCall
from broker.settings import Settings


def task_rows_call(settings: Settings, capability: str, local_ids: Sequence[str], fields: Sequence[str],
                   *, state: str = "", agent_id: str = "", trace_id: str = "", want: int) -> ScriptCall:
    keys = CapabilityKeys(settings.prefix, capability)
    return ScriptCall("task_rows", [keys.task(local) for local in local_ids],
                      [state, agent_id, trace_id, want, *fields])


def parse_task_rows(reply: list[Any]) -> tuple[int, list[tuple[int, list[str | None]]]]:
    """(keys examined, [(0-based position of a match, its field values)])."""
    matches = [(int(reply[i]) - 1, [v if isinstance(v, str) else None for v in reply[i + 1]])
               for i in range(1, len(reply), 2)]
    return int(reply[0]), matches


def dlq_page_call(settings: Settings, capability: str, end: str, start: str, count: int) -> ScriptCall:
    """Up to `count` dead letters from `end` down to `start` (XREVRANGE ids), unfiltered."""
    return ScriptCall("dlq_scan", [CapabilityKeys(settings.prefix, capability).dlq],
                      ["rev", end, start, count, count, "", "", "", 0, 0, "ids"])


def parse_dlq_page(reply: list[Any]) -> list[tuple[str, str]]:
    """[(entry id, task id)], newest first."""
    out = []
    for entry_id, flat in reply[2:]:
        fields = {str(flat[i]): str(flat[i + 1]) for i in range(0, len(flat), 2)}
        out.append((str(entry_id), fields.get("task_id", "")))
    return out
