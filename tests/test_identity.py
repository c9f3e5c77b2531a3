"""Issue 28, agent identity, with real `reach-worker` and dispatcher processes: a live agent id
cannot be taken by a second process, an offline one can (a restart); the fleet's join secret
is required and rotates without restarting agents; tokens expire and are renewed while tasks
outlast them; a revoked agent stops and its running tasks finish on another agent at once.

What a test relies on is read from Redis (records, events) or from `reach` itself, polled with
a deadline. The script-level rules are tests/test_identity_scripts.py.
"""

from __future__ import annotations

import json
import secrets
import signal
import subprocess
import sys
import time

import pytest
import redis

from broker import ReachClient
from broker.keys import RegistryKeys
from broker.settings import Settings
from tests.conftest import ROOT, Fleet, Proc, settings_env, wait_until
from tests.handlers import runs
from tests.registry_reads import (
    MakeSettings,
    agent_hash,
    alive,
    now_ms,
    reach_json,
    registry_events,
    task_events,
)

pytestmark = pytest.mark.one_redis  # (the rules are the scripts', run on every Redis there)

SLEEPY = "tests.handlers:sleepy"


def reach(settings: Settings, *args: str, env: dict[str, str] | None = None,
          stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "reach_cli", *args],
                          env={**settings_env(settings), **(env or {})}, cwd=ROOT, input=stdin,
                          capture_output=True, text=True, timeout=60)


def exits_refused(proc: Proc, timeout: float = 30) -> str:
    """The process exits non-zero; its output."""
    code = proc.wait(timeout)
    assert code != 0, f"{proc.name} exited 0:\n{proc.output()[-3000:]}"
    return proc.output()


def agents_by_id(settings: Settings) -> dict[str, dict[str, object]]:
    return {row["agent_id"]: row for row in reach_json(settings, "agents")}


def registered_events(r: redis.Redis, prefix: str, agent_id: str) -> list[str]:
    return [e["detail"] for e in registry_events(r, prefix, agent_id) if e["type"] == "registered"]


def test_a_second_process_cannot_take_a_live_agent_id(
    settings: Settings, fleet: Fleet, r: redis.Redis, prefix: str, client: ReachClient
) -> None:
    fleet.dispatcher()
    first = fleet.worker("idl", handler="tests.handlers:record", agent_id="shared-id")
    sha = agent_hash(r, prefix, "shared-id")["token_sha"]
    second = fleet.worker("idl", handler="tests.handlers:record", agent_id="shared-id", wait=False)
    output = exits_refused(second)
    assert "agent id 'shared-id' is live and held by another process" in output
    alive(first)
    assert agent_hash(r, prefix, "shared-id")["token_sha"] == sha, "the live agent kept its token"
    row = agents_by_id(settings)["shared-id"]
    assert row["state"] == "healthy" and row["registrations_refused"] == 1
    refusal = str(row["last_refusal"])
    assert refusal.startswith("live: ") and refusal.endswith(f"pid {second.popen.pid}")
    table = reach(settings, "agents", env={"COLUMNS": "250"})
    assert table.returncode == 0 and "1 (live:" in table.stdout
    # The first process works on, undisturbed.
    assert client.run("idl", {"n": 1}, timeout=30) == {"n": 1}
    assert registered_events(r, prefix, "shared-id") == [""]


def test_an_offline_agent_id_is_taken_over_by_a_restart(
    make_settings: MakeSettings, fleet: Fleet, r: redis.Redis, prefix: str
) -> None:
    settings = make_settings(heartbeat_ms=200, suspect_after_ms=600, offline_after_ms=1200)
    fleet.dispatcher(settings=settings)
    first = fleet.worker("ido", handler="tests.handlers:record", agent_id="restarts", settings=settings)
    first.kill()
    wait_until(lambda: agents_by_id(settings)["restarts"]["state"] == "offline", timeout=30,
               message="the killed agent to go offline")
    again = fleet.worker("ido", handler="tests.handlers:record", agent_id="restarts", settings=settings)
    with ReachClient(settings) as client:
        handle = client.submit("ido", {"n": 7})
        assert handle.result(timeout=30) == {"n": 7}
        assert handle.status().agent_id == "restarts"
    alive(again)
    assert agents_by_id(settings)["restarts"]["registrations_refused"] == 0
    assert registered_events(r, prefix, "restarts") == ["", "re-registered"]


def test_the_join_secret_is_required_and_rotates_without_restarting_agents(
    make_settings: MakeSettings, fleet: Fleet, r: redis.Redis, prefix: str
) -> None:
    # A short token life too: the running agent renews its token across the rotation.
    settings = make_settings(agent_token_ttl_ms=2000, heartbeat_ms=500)
    old, new = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    done = reach(settings, "agents", "secret", "set", "--from-env", "FLEET_SECRET",
                 env={"FLEET_SECRET": old})
    assert done.returncode == 0, done.stderr
    assert old not in done.stdout + done.stderr
    status = reach(settings, "agents", "secret", "status", "--json")
    assert '"set": true' in status.stdout
    fleet.dispatcher(settings=settings)

    # (The three start together: each one's fate is its own.)
    without = fleet.worker("idj", handler=SLEEPY, settings=settings, wait=False)
    wrong = fleet.worker("idj", handler=SLEEPY, settings=settings, wait=False,
                         env={"REACH_JOIN_SECRET": "not-the-fleet-secret-at-all"})
    member = fleet.worker("idj", handler=SLEEPY, settings=settings, wait=False,
                          env={"REACH_JOIN_SECRET": old})
    assert "this fleet requires a join secret" in exits_refused(without)
    assert "is not this fleet's" in exits_refused(wrong)
    fleet.wait_healthy(member.agent_id or "", settings, member)

    # Rotate (the new secret from stdin). The member keeps working, well past its token's life.
    rotated = reach(settings, "agents", "secret", "set", stdin=new + "\n")
    assert rotated.returncode == 0, rotated.stderr
    with ReachClient(settings) as client:
        handles = []
        for i in range(6):  # (one after another: 3 s or more, over a token's life)
            handles.append(client.submit("idj", {"n": i, "s": 0.5}))
            assert handles[-1].result(timeout=60)["attempt"] == 1
        assert {h.status().agent_id for h in handles} == {member.agent_id}
    alive(member)
    stale = fleet.worker("idj", handler=SLEEPY, settings=settings, wait=False,
                         env={"REACH_JOIN_SECRET": old})
    fresh = fleet.worker("idj", handler=SLEEPY, settings=settings, wait=False,
                         env={"REACH_JOIN_SECRET": new})
    assert "is not this fleet's" in exits_refused(stale)
    fleet.wait_healthy(fresh.agent_id or "", settings, fresh)
    assert registered_events(r, prefix, member.agent_id or "") == [""], "never registered again"

    # Neither secret is in Redis or in any process's log.
    stored = r.hgetall(RegistryKeys(prefix).join_secret)
    assert not any(s in value for value in stored.values() for s in (old, new))
    for proc in fleet.procs:
        assert old not in proc.output() and new not in proc.output()
    assert reach(settings, "agents", "secret", "clear").returncode == 0
    fleet.worker("idj", handler=SLEEPY, settings=settings)


def test_tokens_are_renewed_while_tasks_outlast_them(
    make_settings: MakeSettings, fleet: Fleet, r: redis.Redis, prefix: str
) -> None:
    settings = make_settings(agent_token_ttl_ms=2000)
    fleet.dispatcher(settings=settings)
    w = fleet.worker("idt", handler=SLEEPY, concurrency=4, settings=settings)
    first_exp = int(agent_hash(r, prefix, w.agent_id or "")["token_exp"])
    with ReachClient(settings) as client:
        # Each task runs 5 s, more than twice the token's life; progress and results are
        # reported with the token, renewed meanwhile.
        handles = [client.submit("idt", {"n": i, "s": 5}) for i in range(4)]
        assert [h.result(timeout=60) for h in handles] == [{"slept": 5, "attempt": 1}] * 4
        for handle in handles:
            events = [e["type"] for e in task_events(r, prefix, handle.task_id)]
            assert events.count("succeeded") == 1 and "reclaimed" not in events, events
    assert runs(r, prefix) == {str(i): 1 for i in range(4)}
    assert int(agent_hash(r, prefix, w.agent_id or "")["token_exp"]) > first_exp + 3000
    assert not [e for e in registry_events(r, prefix, w.agent_id) if e["type"] == "token_refused"]
    assert registered_events(r, prefix, w.agent_id or "") == [""]


def test_a_frozen_agent_whose_token_expired_registers_again_and_works_on(
    make_settings: MakeSettings, fleet: Fleet, r: redis.Redis, prefix: str
) -> None:
    settings = make_settings(agent_token_ttl_ms=1000, heartbeat_ms=300)
    fleet.dispatcher(settings=settings)
    w = fleet.worker("idf", handler="tests.handlers:record", settings=settings)
    w.signal(signal.SIGSTOP)
    try:
        exp = int(agent_hash(r, prefix, w.agent_id or "")["token_exp"])
        wait_until(lambda: now_ms(r) > exp + 500, message="its token to expire")
    finally:
        w.signal(signal.SIGCONT)
    # Its own (expired) token lets it take its still-live id back: no refusal, no exit.
    wait_until(lambda: registered_events(r, prefix, w.agent_id or "") == ["", "re-registered"],
               message="the agent to register again")
    with ReachClient(settings) as client:
        assert client.run("idf", {"n": 3}, timeout=30) == {"n": 3}
    alive(w)
    assert agents_by_id(settings)[w.agent_id or ""]["registrations_refused"] == 0


def test_a_revoked_agent_stops_and_its_running_tasks_finish_on_another_at_once(
    make_settings: MakeSettings, fleet: Fleet, r: redis.Redis, prefix: str
) -> None:
    # Leases far longer than the test: only the revocation can hand the tasks on in time.
    settings = make_settings(lease_ms=120_000)
    fleet.dispatcher(settings=settings)
    doomed = fleet.worker("idr", handler=SLEEPY, concurrency=4, settings=settings)
    with ReachClient(settings) as client:
        # (10 s: they are still running when the second agent is up and the revoke comes; their
        # second attempts are short)
        handles = [client.submit("idr", {"n": i, "s": 10, "then_s": 0.2}) for i in range(4)]
        wait_until(lambda: all(h.status().state == "running" for h in handles),
                   message="every task running on the doomed agent")
        assert {h.status().agent_id for h in handles} == {doomed.agent_id}
        other = fleet.worker("idr", handler=SLEEPY, concurrency=4, settings=settings)
        revoked_at = time.monotonic()
        done = reach(settings, "agents", "revoke", doomed.agent_id or "", "--json")
        assert done.returncode == 0, done.stderr
        # (Who hands them on, this command or a dispatcher that saw the agent offline first,
        # does not matter: each task is reclaimed once, see below.)
        assert json.loads(done.stdout)["revoked"] is True

        output = exits_refused(doomed)
        assert "was revoked by an operator" in output
        results = [h.result(timeout=60) for h in handles]
        assert time.monotonic() - revoked_at < 60
    assert results == [{"slept": 0.2, "attempt": 2}] * 4
    for handle in handles:
        status = handle.status()
        assert status.agent_id == other.agent_id and status.state == "succeeded"
        events = [e["type"] for e in task_events(r, prefix, handle.task_id)]
        assert events.count("succeeded") == 1 and events.count("reclaimed") == 1, events
    row = agents_by_id(settings)[doomed.agent_id or ""]
    assert row["state"] == "offline" and row["revoked"] is True
    alive(other)


def test_the_identity_commands_answer_bad_input_clearly(settings: Settings, r: redis.Redis,
                                                        prefix: str) -> None:
    unknown = reach(settings, "agents", "revoke", "nobody")
    assert unknown.returncode == 1 and unknown.stderr.strip() == "error: no agent 'nobody' is registered"
    short = reach(settings, "agents", "secret", "set", stdin="too-short\n")
    assert short.returncode == 2 and "at least 16 characters" in short.stderr
    unset = reach(settings, "agents", "secret", "set", "--from-env", "NO_SUCH_VARIABLE_HERE")
    assert unset.returncode == 2 and "NO_SUCH_VARIABLE_HERE is not set" in unset.stderr
    assert not r.exists(RegistryKeys(prefix).join_secret), "nothing was stored"
    generated = reach(settings, "agents", "secret", "set", "--generate")
    assert generated.returncode == 0 and len(generated.stdout.strip()) >= 32
    assert reach(settings, "agents", "secret", "status", "--json").stdout.startswith('{"set": true')
    cleared = reach(settings, "agents", "secret", "clear")
    assert cleared.returncode == 0 and cleared.stdout.strip() == "join secret cleared"
    assert reach(settings, "agents", "secret", "clear").stdout.strip() == "no join secret was set"
