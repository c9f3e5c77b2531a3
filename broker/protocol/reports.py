"""An agent's reports about the tasks it runs: how they ended (complete.lua), that it still
runs them (renew.lua), how far they got (progress.lua). Each is fenced: only the attempt the
task expects may report, and a refused token makes the whole call do nothing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from broker.keys import CapabilityKeys
from broker.protocol.cache import cached
from broker.protocol.calls import ScriptCall, Status, feed_args, is_refused, wake_channel
from broker.protocol.delivery import Lease
from broker.protocol.packed_policy import policy_defaults
from broker.settings import Settings


@dataclass(frozen=True, slots=True)
class Completion:
    entry_id: str
    local_id: str
    fence: str
    outcome: str
    body: str
    """The result's JSON on success, else the error text."""
    backoff_ms: int
    exec_ms: int


@dataclass(frozen=True, slots=True)
class CompleteReply:
    refused: bool
    inbox_len: int = 0
    inbox_pending: int = 0
    statuses: tuple[str, ...] = ()
    """Per completion: ok, failed, retry, stale, canceled, dup, gone."""
    pulled: int = 0
    """Ready tasks this call took into the agent's inbox (a standing pull)."""


def complete_call(
    settings: Settings, capability: str, agent_id: str, token: str, done: Sequence[Completion]
) -> ScriptCall:
    keys_head, args_head, task_prefix = cached(
        settings, ("complete", capability, agent_id), lambda: _complete_frame(settings, capability, agent_id))
    keys = list(keys_head)
    args: list[str | int | float] = list(args_head)
    args[1] = token
    for d in done:
        keys.append(task_prefix + d.local_id)
        args += [d.entry_id, d.fence, d.outcome, d.body, d.backoff_ms, d.exec_ms]
    return ScriptCall("complete", keys, args)


def _complete_frame(settings: Settings, capability: str,
                    agent_id: str) -> tuple[tuple[str, ...], tuple[str | int | float, ...], str]:
    """complete.lua's keys and arguments before the completions' (the token's place left '')."""
    ck = CapabilityKeys(settings.prefix, capability)
    keys = (ck.inbox(agent_id), ck.delayed, ck.dlq, ck.events, ck.tokens, ck.health,
            ck.queue, ck.pulls, ck.stats, ck.grants, ck.granted, ck.policy, ck.rate)
    maxlen, task_channels = feed_args(settings)
    args = (agent_id, "", maxlen, task_channels, settings.result_ttl_ms, capability,
            settings.latency_ceiling_ms, settings.cold_start_max_priority, ck.task_prefix,
            wake_channel(settings), policy_defaults(settings, capability))
    return keys, args, ck.task_prefix


def parse_complete(reply: list[Any]) -> CompleteReply:
    if is_refused(reply):
        return CompleteReply(refused=True)
    return CompleteReply(False, int(reply[0]), int(reply[1]), tuple(reply[3:]), int(reply[2]))


@dataclass(frozen=True, slots=True)
class RenewReply:
    refused: bool
    statuses: tuple[str, ...] = ()
    """Per lease: ok, stale, canceled, gone (all but ok: stop running it)."""


def renew_call(
    settings: Settings, capability: str, agent_id: str, token: str, leases: Sequence[Lease]
) -> ScriptCall:
    ck = CapabilityKeys(settings.prefix, capability)
    keys = [ck.inbox(agent_id), ck.tokens] + [ck.task(lease.local_id) for lease in leases]
    args: list[str | int | float] = [agent_id, token]
    for lease in leases:
        args += [lease.entry_id, lease.fence]
    return ScriptCall("renew", keys, args)


def parse_renew(reply: list[Any]) -> RenewReply:
    if is_refused(reply):
        return RenewReply(refused=True)
    return RenewReply(False, tuple(str(status) for status in reply))


def progress_call(
    settings: Settings, capability: str, local_id: str, agent_id: str, token: str, fence: str,
    data: str,
) -> ScriptCall:
    """`data`: the progress event's JSON object, within max_progress_message_bytes (the worker
    checks it with broker/limits.py); the task keeps its latest max_progress_events."""
    ck = CapabilityKeys(settings.prefix, capability)
    return ScriptCall(
        "progress",
        [ck.task(local_id), ck.events, ck.tokens],
        [agent_id, token, fence, data, *feed_args(settings), settings.max_progress_events],
    )


def parse_progress(reply: Any) -> Status:
    """ok, or why the report was dropped: refused (token), gone, canceled, stale."""
    return Status(reply)
