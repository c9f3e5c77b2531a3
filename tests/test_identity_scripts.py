"""Issue 28, agent identity, at the scripts' level (every Redis target): who may register an
agent id, the join secret's verifier, token expiry and revocation, as register.lua,
heartbeat.lua, token_renew.lua, bind.lua, revoke.lua and the reports' token check decide them.
The worker processes that live by these rules are tests/test_identity.py."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import pytest
import redis

from agent_worker.registration import new_token, token_sha
from broker import identity
from broker.errors import BadInput
from broker.infra import connection
from broker.keys import CapabilityKeys, RegistryKeys
from broker.models import AgentDescriptor
from broker.ops.overview import agent_rows
from broker.ops.revoke import UnknownAgent, revoke_agent
from broker.protocol.agents import (
    bind_call,
    heartbeat_call,
    parse_heartbeat,
    parse_register,
    register_call,
    token_renew_call,
)
from broker.protocol.calls import Status
from broker.protocol.reports import parse_renew, renew_call
from broker.scripts import AsyncScripts, Scripts
from broker.settings import Settings
from tests.conftest import wait_until
from tests.registry_reads import MakeSettings, agent_hash, now_ms, registry_events

CAP = "ident"


def register(scripts: Scripts, settings: Settings, agent_id: str, *, held: str = "",
             proof: str = "") -> tuple[Status, str]:
    """Register (and bind) as a worker does; (status, the new token when ok)."""
    token, sha = new_token()
    descriptor = AgentDescriptor(agent_id=agent_id, capabilities=[CAP], max_concurrency=2)
    reply = parse_register(scripts(register_call(
        settings, agent_id, sha, descriptor.model_dump_json(), 0, [CAP], held_token=held,
        join_proof=proof, who="testhost pid 1")))
    if reply.status is Status.OK:
        scripts(bind_call(settings, CAP, agent_id, sha, ttl_ms=settings.agent_token_ttl_ms))
    return reply.status, token


def beat(scripts: Scripts, settings: Settings, agent_id: str, token: str) -> Status:
    return parse_heartbeat(scripts(heartbeat_call(settings, agent_id, token, {"inflight": 0}))).status


def renew_refused(scripts: Scripts, settings: Settings, agent_id: str, token: str) -> bool:
    """Whether a capability script (lease renewal, which checks the token like accept,
    progress and complete do) refuses the token."""
    return parse_renew(scripts(renew_call(settings, CAP, agent_id, token, []))).refused


def test_a_live_id_is_refused_to_a_process_without_its_token_and_recorded(
    settings: Settings, r: redis.Redis, prefix: str
) -> None:
    scripts = Scripts(r)
    status, first = register(scripts, settings, "a1")
    assert status is Status.OK
    sha = agent_hash(r, prefix, "a1")["token_sha"]

    assert register(scripts, settings, "a1")[0] is Status.LIVE
    assert register(scripts, settings, "a1", held="a-guessed-token")[0] is Status.LIVE
    record = agent_hash(r, prefix, "a1")
    assert record["token_sha"] == sha, "the live agent kept its token"
    assert record["register_refused"] == "2"
    assert record["last_refused"] == "live: testhost pid 1"
    assert beat(scripts, settings, "a1", first) is Status.OK
    assert not renew_refused(scripts, settings, "a1", first)
    refused = [e for e in registry_events(r, prefix, "a1") if e["type"] == "register_refused"]
    assert [e["detail"] for e in refused] == ["live: testhost pid 1"] * 2
    row = {row.agent_id: row for row in agent_rows(r, settings)}["a1"]
    assert row.registrations_refused == 2 and row.last_refusal == "live: testhost pid 1"
    assert row.last_refusal_age_s is not None and row.state == "healthy" and not row.revoked

    # The holder of the current token may register again (a worker whose token was refused).
    status, second = register(scripts, settings, "a1", held=first)
    assert status is Status.OK
    assert beat(scripts, settings, "a1", first) is Status.REFUSED
    assert renew_refused(scripts, settings, "a1", first)
    assert beat(scripts, settings, "a1", second) is Status.OK


def test_an_offline_id_is_taken_over(make_settings: MakeSettings, r: redis.Redis, prefix: str) -> None:
    settings = make_settings(suspect_after_ms=100, offline_after_ms=200)
    scripts = Scripts(r)
    status, old = register(scripts, settings, "a2")
    assert status is Status.OK
    assert register(scripts, settings, "a2")[0] is Status.LIVE
    # No beat for offline_after_ms (the server's clock): a restarted process takes the id.
    start = now_ms(r)
    wait_until(lambda: now_ms(r) - start > 250, message="the id to go offline")
    status, new = register(scripts, settings, "a2")
    assert status is Status.OK
    assert beat(scripts, settings, "a2", old) is Status.REFUSED
    assert beat(scripts, settings, "a2", new) is Status.OK


def test_an_expired_token_is_refused_until_renewed_or_registered_again(
    make_settings: MakeSettings, r: redis.Redis, prefix: str
) -> None:
    settings = make_settings(agent_token_ttl_ms=400)
    scripts = Scripts(r)
    status, token = register(scripts, settings, "a3")
    assert status is Status.OK
    tokens = CapabilityKeys(prefix, CAP).tokens
    assert int(r.hget(tokens, "exp:a3") or 0) > now_ms(r)
    # Renewed (registry, then capability): the expiry moves on.
    before = int(agent_hash(r, prefix, "a3")["token_exp"])
    wait_until(lambda: now_ms(r) > before - 300, message="some time to pass")
    reply = parse_heartbeat(scripts(token_renew_call(settings, "a3", token)))
    assert reply.status is Status.OK and reply.server_ms and reply.server_ms > before
    assert int(agent_hash(r, prefix, "a3")["token_exp"]) == reply.server_ms
    assert scripts(bind_call(settings, CAP, "a3", token_sha(token), ttl_ms=400, renew_only=True)) == 1
    assert scripts(bind_call(settings, CAP, "a3", "0" * 40, ttl_ms=400, renew_only=True)) == 0
    assert r.hget(tokens, "a3") == token_sha(token), "a renewal never binds another token"

    # Not renewed: refused everywhere, like a stale token, and recorded as expired.
    wait_until(lambda: beat(scripts, settings, "a3", token) is Status.REFUSED, timeout=10,
               message="the token to expire")
    wait_until(lambda: renew_refused(scripts, settings, "a3", token), timeout=10,
               message="the capability side to expire")
    assert parse_heartbeat(scripts(token_renew_call(settings, "a3", token))).status is Status.REFUSED
    details = [e["detail"] for e in registry_events(r, prefix, "a3") if e["type"] == "token_refused"]
    assert "heartbeat (expired)" in details and "renewal (expired)" in details
    # Its holder registers again with it (the id is still live) and works on.
    status, fresh = register(scripts, settings, "a3", held=token)
    assert status is Status.OK
    assert beat(scripts, settings, "a3", fresh) is Status.OK
    assert not renew_refused(scripts, settings, "a3", fresh)


def revoke(settings: Settings, agent_id: str) -> Any:
    async def go() -> Any:
        client = connection.async_client(settings)
        try:
            return await revoke_agent(client, AsyncScripts(client), settings, agent_id, "tester")
        finally:
            await client.aclose()
    return asyncio.run(go())


def test_a_revoked_token_is_refused_everywhere_and_never_registers_again(
    settings: Settings, r: redis.Redis, prefix: str
) -> None:
    scripts = Scripts(r)
    status, token = register(scripts, settings, "a4")
    assert status is Status.OK
    result = revoke(settings, "a4")
    assert result.as_dict() == {"agent_id": "a4", "revoked": True, "already": False,
                                "released": {CAP: 0}, "reclaimed": {CAP: 0}}
    assert beat(scripts, settings, "a4", token) is Status.REVOKED
    assert parse_heartbeat(scripts(token_renew_call(settings, "a4", token))).status is Status.REVOKED
    assert renew_refused(scripts, settings, "a4", token)
    assert register(scripts, settings, "a4", held=token)[0] is Status.REVOKED
    row = {row.agent_id: row for row in agent_rows(r, settings)}["a4"]
    assert row.revoked and row.state == "offline" and row.last_refusal == "revoked: testhost pid 1"
    assert [e["detail"] for e in registry_events(r, prefix, "a4") if e["type"] == "revoked"] == ["tester"]
    assert revoke(settings, "a4").already
    # The inbox stays (its process must not find it gone and bind its token again).
    assert r.sismember(CapabilityKeys(prefix, CAP).inboxes, "a4")
    with pytest.raises(UnknownAgent):
        revoke(settings, "nobody")
    # A new process (no token: a restart) may take the id, which is offline.
    status, fresh = register(scripts, settings, "a4")
    assert status is Status.OK and beat(scripts, settings, "a4", fresh) is Status.OK
    assert not {row.agent_id: row for row in agent_rows(r, settings)}["a4"].revoked


def test_the_join_secret_is_required_checked_and_stored_only_as_a_verifier(
    settings: Settings, r: redis.Redis, prefix: str
) -> None:
    scripts = Scripts(r)
    secret = secrets.token_urlsafe(24)
    identity.set_secret(r, settings, secret, now_ms(r))
    stored = r.hgetall(RegistryKeys(prefix).join_secret)
    assert set(stored) == {"salt", "iterations", "verifier", "set_at"}
    assert all(secret not in value for value in stored.values())
    params = identity.parse_params(stored)
    assert params is not None
    proof = identity.join_proof(secret, params)
    assert proof not in stored.values(), "what a worker presents is not what is stored"

    assert register(scripts, settings, "j1")[0] is Status.SECRET_REQUIRED
    wrong = identity.join_proof("x" * 32, params)
    assert register(scripts, settings, "j1", proof=wrong)[0] is Status.SECRET_WRONG
    assert register(scripts, settings, "j1", proof=stored["verifier"])[0] is Status.SECRET_WRONG
    assert not r.exists(RegistryKeys(prefix).agent("j1")), "a refused stranger leaves no record"
    details = [e["detail"] for e in registry_events(r, prefix, "j1")]
    assert details == ["secret_required: testhost pid 1", "secret_wrong: testhost pid 1",
                       "secret_wrong: testhost pid 1"]
    status, token = register(scripts, settings, "j1", proof=proof)
    assert status is Status.OK

    # Rotation: the registered agent keeps its token; only registrations need the new secret.
    identity.set_secret(r, settings, secrets.token_urlsafe(24), now_ms(r))
    assert beat(scripts, settings, "j1", token) is Status.OK
    assert parse_heartbeat(scripts(token_renew_call(settings, "j1", token))).status is Status.OK
    assert register(scripts, settings, "j2", proof=proof)[0] is Status.SECRET_WRONG
    assert identity.clear_secret(r, settings)
    assert register(scripts, settings, "j2")[0] is Status.OK


@pytest.mark.parametrize("secret", ["short", " padded-secret-value ", "tab\tinside-the-secret"])
def test_a_join_secret_that_will_not_do_is_refused_clearly(secret: str) -> None:
    with pytest.raises(BadInput):
        identity.check_secret(secret)
