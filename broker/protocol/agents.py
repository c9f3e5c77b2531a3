"""The registry's scripts: an agent registers, binds to its capabilities, beats, leaves; a
dispatcher records the state it judged. Unbinding is bind's counterpart (unbind.lua)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from broker import codec
from broker.keys import CapabilityKeys, RegistryKeys
from broker.protocol.calls import ScriptCall, Status, wake_channel
from broker.settings import Settings


def register_call(
    settings: Settings, agent_id: str, token_sha: str, descriptor_json: str, warmup_ms: int,
    capabilities: Sequence[str], described_json: str = "",
) -> ScriptCall:
    """`described_json`: the capabilities' descriptions (broker/models.py described_json)."""
    rk = RegistryKeys(settings.prefix)
    return ScriptCall(
        "register",
        [rk.agents, rk.agent(agent_id), rk.events, rk.capabilities, rk.changes, rk.rev, rk.served],
        [agent_id, token_sha, descriptor_json, warmup_ms, wake_channel(settings), described_json,
         *capabilities],
    )


def bind_call(settings: Settings, capability: str, agent_id: str, token_sha: str) -> ScriptCall:
    ck = CapabilityKeys(settings.prefix, capability)
    return ScriptCall("bind", [ck.tokens, ck.inboxes, ck.inbox(agent_id)], [agent_id, token_sha])


def unbind_call(settings: Settings, capability: str, agent_id: str) -> ScriptCall:
    """Take the agent off the capability (its inbox goes too, unless entries wait there; the
    reply says whether it went)."""
    ck = CapabilityKeys(settings.prefix, capability)
    return ScriptCall("unbind", [ck.tokens, ck.inboxes, ck.inbox(agent_id)], [agent_id])


@dataclass(frozen=True, slots=True)
class HeartbeatReply:
    status: Status
    """ok, refused (token) or unknown (no such agent)."""
    server_ms: int | None = None


def heartbeat_call(
    settings: Settings, agent_id: str, token: str, stats: dict[str, Any], mode: str = "",
    significant: bool = True,
) -> ScriptCall:
    """A beat with the agent's numbers; `significant` when routing should re-read the record."""
    rk = RegistryKeys(settings.prefix)
    return ScriptCall(
        "heartbeat",
        [rk.agents, rk.agent(agent_id), rk.events, rk.changes, rk.rev],
        [agent_id, token, codec.dumps(stats), mode, wake_channel(settings), "1" if significant else ""],
    )


def parse_heartbeat(reply: list[Any]) -> HeartbeatReply:
    return HeartbeatReply(Status(reply[0]), int(reply[1]) if len(reply) > 1 else None)


def deregister_call(settings: Settings, agent_id: str, token: str) -> ScriptCall:
    """The reply (parse with Status): ok, refused or unknown."""
    rk = RegistryKeys(settings.prefix)
    return ScriptCall(
        "deregister", [rk.agents, rk.agent(agent_id), rk.events, rk.changes, rk.rev],
        [agent_id, token, wake_channel(settings)],
    )


def agent_state_call(settings: Settings, agent_id: str, known: str, new: str) -> ScriptCall:
    """Record a state change once (the reply: 1 when this call recorded it)."""
    rk = RegistryKeys(settings.prefix)
    return ScriptCall("agent_state", [rk.agent(agent_id), rk.events, rk.changes, rk.rev],
                      [agent_id, known, new, wake_channel(settings)])
