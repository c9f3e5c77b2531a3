"""`reach agents revoke ID`: cut an agent off at once and hand its tasks to others.

In this order, so that no step undoes an earlier one:
1. the registry's side (revoke.lua): the token's hash moves to `revoked_sha`; the agent reads
   as offline, and its process is told `revoked` by its next heartbeat, renewal or
   registration (it stops; its old token never registers again);
2. each capability's side (unbind.lua, inbox kept): its token opens no script any more, so
   nothing it reports, accepts or renews from now on counts (its effects are fenced off);
3. what it left unread goes back to the queue (release.lua), and what it holds (read,
   running) is claimed and requeued as a new attempt at once (reclaim.lua), not after its
   lease lapses. A running handler's late result is refused (the token, and the fence).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from broker import inbox
from broker.errors import ReachError
from broker.infra.connection import AsyncRedis
from broker.keys import RegistryKeys
from broker.models import AgentDescriptor
from broker.protocol.agents import revoke_call, unbind_call
from broker.protocol.calls import Status
from broker.scripts import AsyncScripts
from broker.settings import Settings

REASON = "agent revoked"


class UnknownAgent(ReachError, LookupError):
    """No agent of that id is registered."""


@dataclass
class RevokeResult:
    agent_id: str
    already: bool = False
    """It was revoked before (its tasks are handed on again all the same)."""
    released: dict[str, int] = field(default_factory=dict)
    """Per capability: unread tasks put back in the queue."""
    reclaimed: dict[str, int] = field(default_factory=dict)
    """Per capability: tasks it held (read or running), requeued or failed for good."""

    def as_dict(self) -> dict[str, object]:
        return {"agent_id": self.agent_id, "revoked": True, "already": self.already,
                "released": self.released, "reclaimed": self.reclaimed}


async def revoke_agent(client: AsyncRedis, scripts: AsyncScripts, settings: Settings, agent_id: str,
                       who: str = "") -> RevokeResult:
    raw = await client.hget(RegistryKeys(settings.prefix).agent(agent_id), "descriptor")
    if raw is None:
        raise UnknownAgent(f"no agent {agent_id!r} is registered")
    try:
        capabilities = AgentDescriptor.model_validate_json(raw).capabilities
    except ValueError as exc:
        raise ReachError(f"agent {agent_id!r} has a record that does not parse: {exc}") from exc
    status = Status(await scripts(revoke_call(settings, agent_id, who)))
    if status is Status.UNKNOWN:
        raise UnknownAgent(f"no agent {agent_id!r} is registered")
    result = RevokeResult(agent_id, already=status is Status.REVOKED)
    consumer = f"revoke:{agent_id}"
    for capability in capabilities:
        await scripts(unbind_call(settings, capability, agent_id, keep_inbox=True))
        result.released[capability] = await inbox.release_unread(
            client, scripts, settings, capability, agent_id, REASON)
        result.reclaimed[capability] = await inbox.reclaim_lapsed(
            client, scripts, settings, capability, agent_id, consumer, 0, REASON)
    return result
