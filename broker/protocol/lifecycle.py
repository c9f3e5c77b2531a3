"""The scripts that move a task along outside its agent's reports: cancel, wait on, promote
and expire it, and park an unreadable entry; with the readers of their replies."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from broker import codec
from broker.errors import TaskCanceled, TaskFailed
from broker.ids import split_task_id
from broker.keys import TASK_DONE_MESSAGE, CapabilityKeys, Channels
from broker.models import TaskEvent
from broker.protocol.calls import ScriptCall, Status, feed_args, wake_channel
from broker.protocol.packed_policy import policy_defaults
from broker.protocol.trace import trace_id_of
from broker.settings import Settings

# -- cancel.lua --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CancelReply:
    status: Status
    """canceled, terminal (it had ended), gone, or moved (to `detail`, another agent)."""
    detail: str = ""
    """The previous state (canceled, terminal), or the agent it moved to (moved)."""


def cancel_call(settings: Settings, task_id: str, agent_id: str) -> ScriptCall:
    """Cancel a task that the caller saw with `agent_id` ('' for none): see cancel.lua."""
    capability, local = split_task_id(task_id)
    ck = CapabilityKeys(settings.prefix, capability)
    return ScriptCall(
        "cancel",
        [ck.queue, ck.delayed, ck.task(local), ck.events, ck.inbox(agent_id), ck.stats, ck.canceled],
        [local, *feed_args(settings), settings.result_ttl_ms, agent_id,
         Channels(settings.prefix).control(agent_id)],
    )


def parse_cancel(reply: list[Any]) -> CancelReply:
    return CancelReply(Status(reply[0]), str(reply[1]) if len(reply) > 1 else "")


# -- watch.lua ---------------------------------------------------------------------------------

WatchWhat = Literal["outcome", "events"]


def watch_call(settings: Settings, task_id: str, what: WatchWhat, flag: Literal["d", "w"],
               after: int = 0) -> ScriptCall:
    """Read a task's outcome ('outcome') or its events after `after` ('events') and register
    the wait with `flag`: 'd' (block on the done list) or 'w' (follow the channel)."""
    capability, local = split_task_id(task_id)
    return ScriptCall("watch", [CapabilityKeys(settings.prefix, capability).task(local)],
                      [what, flag, after])


def task_exists(reply: Sequence[Any]) -> bool:
    """Whether watch.lua found the task ({false} when it does not exist)."""
    return bool(reply) and bool(reply[0])


def parse_outcome(task_id: str, fields: Sequence[Any]) -> tuple[bool, Any]:
    """(done, result) from watch.lua's 'outcome' reply (state, result, reason, error); raises
    TaskFailed/TaskCanceled for those ends."""
    state, result, reason, error = fields[:4]
    if state == "succeeded":
        return True, codec.loads(result) if result else None
    if state == "failed":
        raise TaskFailed(task_id, reason or "failure", error or None)
    if state == "canceled":
        raise TaskCanceled(task_id, error or None)
    return False, None


def done_outcome(text: str) -> tuple[str, Any, str | None, str | None] | None:
    """(state, result, reason, error) from the JSON a terminal script pushed to the task's done
    list or published on its channel (see lua/_finish.lua); None when the text is no outcome or
    a success's result was too large to ride along (read the record then)."""
    try:
        data = codec.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    state = data.get("state")
    if state == "succeeded":
        return (state, data["result"], None, None) if "result" in data else None
    if state in ("failed", "canceled"):
        return state, None, data.get("reason") or None, data.get("error") or None
    return None


def parse_done(task_id: str, text: str) -> tuple[bool, Any]:
    """(done, result) from a done JSON (see done_outcome); raises TaskFailed/TaskCanceled for
    those ends; (False, None) when the record must be read."""
    outcome = done_outcome(text)
    if outcome is None:
        return False, None
    state, result, reason, error = outcome
    if state == "succeeded":
        return True, result
    return parse_outcome(task_id, (state, None, reason, error))


def done_message(message: str) -> str | None:
    """The outcome JSON a task channel's done message carries; None for any other message."""
    return message[len(TASK_DONE_MESSAGE):] if message.startswith(TASK_DONE_MESSAGE) else None


def message_outcome(message: str) -> tuple[str, Any, str | None, str | None] | None:
    """done_outcome of a task channel's done message; None for any other message."""
    text = done_message(message)
    return None if text is None else done_outcome(text)


def parse_events(reply: Sequence[Any]) -> tuple[str | None, int, list[TaskEvent]]:
    """(state, the task's event count, the events returned) from watch.lua's 'events' reply;
    state None when the task does not exist. Entries that do not parse are skipped."""
    if not task_exists(reply):
        return None, 0, []
    state, trace_id, seq, task_id = reply[0], trace_id_of(reply[1]), int(reply[2]), reply[3]
    events = []
    for i in range(4, len(reply) - 1, 2):
        try:
            events.append(TaskEvent.from_compact(int(reply[i]), reply[i + 1], task_id, trace_id))
        except ValueError:
            continue
    return state, seq, events


# -- promote.lua, expire.lua, dead_letter_raw.lua ------------------------------------------------

def promote_call(settings: Settings, capability: str, local_ids: Sequence[str]) -> ScriptCall:
    """Move due retries back into the ready queue (the reply: how many)."""
    ck = CapabilityKeys(settings.prefix, capability)
    keys = [ck.delayed, ck.queue, ck.events, ck.policy] + [ck.task(local) for local in local_ids]
    maxlen, task_channels = feed_args(settings)
    args: list[str | int | float] = [
        policy_defaults(settings, capability), maxlen, task_channels, capability,
        wake_channel(settings), *local_ids,
    ]
    return ScriptCall("promote", keys, args)


@dataclass(frozen=True, slots=True)
class ExpireReply:
    expired: int
    rescheduled: int


def expire_call(settings: Settings, capability: str, local_ids: Sequence[str]) -> ScriptCall:
    ck = CapabilityKeys(settings.prefix, capability)
    keys = [ck.deadlines, ck.queue, ck.delayed, ck.dlq, ck.events, ck.stats]
    keys += [ck.task(local) for local in local_ids]
    args: list[str | int | float] = [
        *feed_args(settings), settings.result_ttl_ms, ck.inbox_prefix,
        Channels(settings.prefix).control_prefix, *local_ids,
    ]
    return ScriptCall("expire", keys, args)


def parse_expire(reply: list[Any]) -> ExpireReply:
    return ExpireReply(int(reply[0]), int(reply[1]))


def no_agent_call(settings: Settings, capability: str, no_agent_timeout_ms: int,
                  local_ids: Sequence[str]) -> ScriptCall:
    """Fail the queued tasks (of `local_ids`) no agent could take for the no-agent timeout."""
    ck = CapabilityKeys(settings.prefix, capability)
    keys = [ck.queue, ck.dlq, ck.events, ck.stats, *(ck.task(local) for local in local_ids)]
    args: list[str | int | float] = [*feed_args(settings), settings.result_ttl_ms,
                                     no_agent_timeout_ms, *local_ids]
    return ScriptCall("no_agent", keys, args)


def dead_letter_raw_call(
    settings: Settings, capability: str, stream: str, group: str, entry_id: str, reason: str,
    error: str, raw: dict[str, Any],
) -> ScriptCall:
    ck = CapabilityKeys(settings.prefix, capability)
    return ScriptCall(
        "dead_letter_raw", [stream, ck.dlq, ck.stats],
        [group, entry_id, reason, error, codec.dumps(raw), capability],
    )
