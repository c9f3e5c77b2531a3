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
    capabilities: Sequence[str], described_json: str = "", *, held_token: str = "",
    join_proof: str = "", who: str = "",
) -> ScriptCall:
    """`described_json`: the capabilities' descriptions (broker/models.py described_json).
    `held_token`: the token this process holds for the id (it may take the id while it is
    live); `join_proof`: broker/identity.py join_proof when the fleet has a join secret; `who`:
    the caller's host and pid, recorded with a refusal. Parse the reply with parse_register."""
    rk = RegistryKeys(settings.prefix)
    return ScriptCall(
        "register",
        [rk.agents, rk.agent(agent_id), rk.events, rk.capabilities, rk.changes, rk.rev, rk.served],
        [agent_id, token_sha, descriptor_json, warmup_ms, wake_channel(settings), described_json,
         held_token, settings.offline_after_ms, settings.agent_token_ttl_ms, join_proof, who,
         rk.join_secret, *capabilities],
    )


@dataclass(frozen=True, slots=True)
class RegisterReply:
    status: Status
    """ok, or why the registry refused: live, revoked, secret_required, secret_wrong."""
    ms: int | None = None
    """ok: the server's time; live: how long since the live agent's last heartbeat."""


def parse_register(reply: Any) -> RegisterReply:
    return RegisterReply(Status(reply[0]), int(reply[1]) if len(reply) > 1 else None)


def bind_call(settings: Settings, capability: str, agent_id: str, token_sha: str, *,
              ttl_ms: int = 0, renew_only: bool = False) -> ScriptCall:
    """Bind the agent's token (expiring ttl_ms from now; 0: never), or with `renew_only` move
    the expiry of the token bound on (the reply: 0 when another token, or none, is bound)."""
    ck = CapabilityKeys(settings.prefix, capability)
    return ScriptCall("bind", [ck.tokens, ck.inboxes, ck.inbox(agent_id)],
                      [agent_id, token_sha, ttl_ms, "1" if renew_only else ""])


def unbind_call(settings: Settings, capability: str, agent_id: str, *,
                keep_inbox: bool = False) -> ScriptCall:
    """Take the agent off the capability (its inbox goes too, unless entries wait there or
    `keep_inbox`; the reply says whether it went)."""
    ck = CapabilityKeys(settings.prefix, capability)
    return ScriptCall("unbind", [ck.tokens, ck.inboxes, ck.inbox(agent_id)],
                      [agent_id, "1" if keep_inbox else ""])


@dataclass(frozen=True, slots=True)
class HeartbeatReply:
    status: Status
    """ok, refused (token wrong or expired), unknown (no such agent) or revoked."""
    server_ms: int | None = None
    """The server's time (a beat), or the token's new expiry (a renewal)."""


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


def token_renew_call(settings: Settings, agent_id: str, token: str) -> ScriptCall:
    """Move the token's expiry agent_token_ttl_ms on (the registry's side). The reply (parse
    with parse_heartbeat): ok with the new expiry, refused, unknown or revoked."""
    rk = RegistryKeys(settings.prefix)
    return ScriptCall("token_renew", [rk.agent(agent_id), rk.events],
                      [agent_id, token, settings.agent_token_ttl_ms])


def revoke_call(settings: Settings, agent_id: str, who: str = "") -> ScriptCall:
    """Revoke the agent's token (the registry's side). The reply (parse with Status): ok,
    unknown, or revoked (it was already)."""
    rk = RegistryKeys(settings.prefix)
    return ScriptCall("revoke", [rk.agents, rk.agent(agent_id), rk.events, rk.changes, rk.rev],
                      [agent_id, wake_channel(settings), who])


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
