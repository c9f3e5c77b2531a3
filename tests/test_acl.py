"""Least-privilege Redis roles (broker/acl.py, `reach acl`) against a real redis-server that
knows ACL users only: the spine, retries, reclaim, the DLQ tools, the gateway and the console
run under their roles; what a role may not do is refused with a clear error; tenants (prefixes)
cannot see one another."""

from __future__ import annotations

import json
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from typer.testing import CliRunner

from broker import PermissionDenied, ReachClient
from broker.acl import NEVER, Role, is_permission_error, password_hash, role_commands, rule
from broker.infra.embedded import EmbeddedRedis
from broker.keys import Channels, RegistryKeys
from broker.settings import Settings
from reach_cli.main import app
from tests.acl_helpers import AclServer, role_settings, start_acl_server
from tests.conftest import Fleet, settings_env, wait_until
from tests.gateway_helpers import start_gateway
from tests.handlers import runs


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AclServer]:
    made = start_acl_server(tmp_path_factory.mktemp("acl-redis"))
    yield made
    made.stop()


class Tenant:
    """Every role's user for one prefix, and the settings a process of each role loads."""

    def __init__(self, server: AclServer, prefix: str) -> None:
        self.server = server
        self.prefix = prefix
        self.urls = {role: server.add_role(role, prefix) for role in Role}
        # (The test handlers count their runs under PREFIX:test:*, a key no role knows.)
        admin = server.admin()
        admin.execute_command("ACL", "SETUSER", f"{prefix}-agent", f"~{prefix}:test:*")
        admin.close()

    def settings(self, role: Role, **overrides: Any) -> Settings:
        return role_settings(self.urls[role], self.prefix, **overrides)

    def cli(self, role: Role, *args: str) -> Any:
        return CliRunner().invoke(app, list(args), env=settings_env(self.settings(role)),
                                  catch_exceptions=False)

    def drop(self) -> None:
        admin = self.server.admin()
        try:
            for key in admin.scan_iter(match=f"{self.prefix}:*", count=1000):
                admin.unlink(key)
            for role in Role:
                admin.execute_command("ACL", "DELUSER", f"{self.prefix}-{role}")
        finally:
            admin.close()


@pytest.fixture
def tenant(server: AclServer) -> Iterator[Tenant]:
    made = Tenant(server, f"ta{secrets.token_hex(3)}")
    yield made
    made.drop()


@pytest.fixture
def fleet_of(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[list[Fleet]]:
    """Fleets made by the test (each under its own settings), killed at the end."""
    fleets: list[Fleet] = []
    yield fleets
    for fleet in fleets:
        fleet.stop_all()
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        for fleet in fleets:
            for proc in fleet.procs:
                sys.stderr.write(f"\n----- {proc.name} -----\n{proc.output()[-4000:]}\n")


def make_fleet(fleets: list[Fleet], settings: Settings, tmp: Path) -> Fleet:
    fleet = Fleet(settings, tmp)
    fleets.append(fleet)
    return fleet


def admin_runs(server: AclServer, prefix: str) -> dict[str, int]:
    admin = server.admin()
    try:
        return runs(admin, prefix)
    finally:
        admin.close()


def refused(result: Any) -> str:
    """A CLI run that Redis's ACL refused: exit 1, one clear line on stderr."""
    assert result.exit_code == 1, (result.exit_code, result.stdout, result.stderr)
    assert "lack of permission" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    return str(result.stderr)


# -- the rules themselves --------------------------------------------------------------------


def test_every_rule_loads_from_an_aclfile_and_refuses_what_reach_never_sends(tmp_path: Path) -> None:
    lines = [rule(role, "tq").aclfile_line(password_hash("pw")) for role in Role]
    server = start_acl_server(tmp_path, lines)
    admin = server.admin()
    try:
        def dry(role: Role, *command: str) -> str:
            return str(admin.execute_command("ACL", "DRYRUN", f"tq-{role}", *command))

        for role in Role:
            for command in (("flushall",), ("flushdb",), ("config", "get", "maxmemory"), ("keys", "*"),
                            ("debug", "sleep", "0"), ("script", "flush"), ("shutdown",)):
                assert dry(role, *command) != "OK", (role, command)
            assert dry(role, "ping") == "OK"
            assert dry(role, "get", "other:{x}:queue") != "OK"  # another prefix's key
        # The reader reads and never writes, even through a script.
        assert dry(Role.READER, "hget", "tq:{cap}:task:1", "state") == "OK"
        assert dry(Role.READER, "hset", "tq:{cap}:task:1", "state", "x") != "OK"
        assert dry(Role.READER, "evalsha", "0" * 40, "1", "tq:{cap}:dlq") != "OK"
        assert dry(Role.READER, "evalsha_ro", "0" * 40, "1", "tq:{cap}:dlq") == "OK"
        # Producers and agents never reach what only operators touch.
        for role in (Role.PRODUCER, Role.AGENT):
            assert dry(role, "hset", "tq:{_registry}:apikeys", "k", "v") != "OK"
            assert dry(role, "hset", "tq:{_registry}:schedules", "k", "v") != "OK"
        assert dry(Role.PRODUCER, "xdel", "tq:{cap}:dlq", "1-1") != "OK"
        assert dry(Role.PRODUCER, "xadd", "tq:{cap}:intake", "*", "payload", "1") == "OK"
        assert dry(Role.OPERATOR, "xdel", "tq:{cap}:dlq", "1-1") == "OK"
        # Channels: the prefix's own only (Redis 7 grants none by default).
        assert dry(Role.PRODUCER, "subscribe", "tq:ev:cap:1") == "OK"
        assert dry(Role.PRODUCER, "subscribe", "other:ev:cap:1") != "OK"
    finally:
        admin.close()
        server.stop()


def test_no_role_is_ever_given_a_dangerous_command() -> None:
    for role in Role:
        for version in (6, 7):
            assert not role_commands(role, version) & NEVER
    writes = {"hset", "hdel", "xadd", "xdel", "xtrim", "del", "unlink", "set", "zadd", "zrem",
              "sadd", "publish", "evalsha", "eval", "blmove", "rpush", "lpop"}
    assert not role_commands(Role.READER, 7) & writes
    assert role_commands(Role.READER, 6) & writes == {"evalsha"}  # (its scripts cannot write)
    assert "evalsha_ro" in role_commands(Role.READER, 7)


def test_redis_62_takes_the_nearest_rules_and_the_reader_still_cannot_write() -> None:
    embedded = EmbeddedRedis().start()
    admin = redis.Redis.from_url(embedded.url, decode_responses=True)
    try:
        for role in Role:
            admin.execute_command(*rule(role, "tq", redis_version=6).setuser(password_hash("pw")).split())
        host_port = embedded.url.split("//", 1)[1]
        reader = redis.Redis.from_url(f"redis://tq-reader:pw@{host_port}", decode_responses=True)
        admin.hset("tq:{cap}:task:1", "state", "queued")
        assert reader.hget("tq:{cap}:task:1", "state") == "queued"
        with pytest.raises(redis.exceptions.NoPermissionError):
            reader.hset("tq:{cap}:task:1", "state", "x")
        # (EVALSHA is the reader's on 6.2, but the script's own commands are checked.)
        sha = admin.script_load("return redis.call('HSET', KEYS[1], 'state', 'x')")
        with pytest.raises(redis.exceptions.ResponseError) as script_write:
            reader.evalsha(sha, 1, "tq:{cap}:task:1")
        assert is_permission_error(script_write.value), script_write.value
        assert admin.hget("tq:{cap}:task:1", "state") == "queued"
        reader.close()
    finally:
        admin.delete("tq:{cap}:task:1")
        for role in Role:
            admin.execute_command("ACL", "DELUSER", f"tq-{role}")
        admin.close()
        embedded.stop()


def test_reach_acl_prints_a_setuser_the_server_takes(server: AclServer) -> None:
    done = CliRunner().invoke(app, ["acl", "--role", "reader", "--prefix", "tcli", "--user", "cli-r"])
    assert done.exit_code == 0, done.stderr
    setuser, aclfile = done.stdout.strip().splitlines()
    assert setuser.startswith("ACL SETUSER cli-r reset on #") and "%R~tcli:*" in setuser
    assert aclfile.startswith("user cli-r on #")
    password = done.stderr.rsplit(": ", 1)[1].strip()
    assert password not in done.stdout  # (only its hash goes into the rule)
    admin = server.admin()
    try:
        admin.execute_command(*setuser.split())
        reader = redis.Redis.from_url(server.url("cli-r", password), decode_responses=True)
        assert reader.ping()
        with pytest.raises(redis.exceptions.NoPermissionError):
            reader.set("tcli:x", "1")
        reader.close()
    finally:
        admin.execute_command("ACL", "DELUSER", "cli-r")
        admin.close()
    as_json = CliRunner().invoke(app, ["acl", "--role", "agent", "--prefix", "t6", "--redis-version", "6",
                                       "--password", "pw", "--json"])
    body = json.loads(as_json.stdout)
    assert body["aclfile"] == rule(Role.AGENT, "t6", redis_version=6).aclfile_line(password_hash("pw"))
    assert "password" not in body and "%R~" not in body["setuser"]
    assert CliRunner().invoke(app, ["acl", "--role", "root"]).exit_code == 2


# -- the system under its roles --------------------------------------------------------------


def test_spine_retry_and_reclaim_run_under_their_roles(tenant: Tenant, fleet_of: list[Fleet],
                                                        tmp_path: Path) -> None:
    procs = make_fleet(fleet_of, tenant.settings(Role.AGENT), tmp_path)
    procs.dispatcher(settings=tenant.settings(Role.DISPATCHER))
    first = procs.worker("work", handler="tests.handlers:sleepy", wait=False)
    admin_settings = role_settings(tenant.server.admin_url, tenant.prefix)
    procs.wait_healthy(str(first.agent_id), admin_settings, first)
    with ReachClient(tenant.settings(Role.PRODUCER)) as client:
        assert client.submit("work", {"n": "a", "s": 0}).result(timeout=60) == {"slept": 0, "attempt": 1}
        # A retry: fails once (retryable), succeeds on attempt 2.
        flaky = procs.worker("flaky", handler="tests.handlers:flaky", wait=False)
        procs.wait_healthy(str(flaky.agent_id), admin_settings, flaky)
        assert client.submit("flaky", {"n": "f"}).result(timeout=60) == {"attempt": 2}
        # A reclaim after SIGKILL: another agent finishes the task.
        handle = client.submit("work", {"n": "k", "s": 3})
        wait_until(lambda: admin_runs(tenant.server, tenant.prefix).get("k") == 1, 30,
                   message="the handler started")
        first.kill()
        second = procs.worker("work", handler="tests.handlers:sleepy", wait=False)
        procs.wait_healthy(str(second.agent_id), admin_settings, second)
        assert handle.result(timeout=90) == {"slept": 3, "attempt": 2}
        assert client.status(handle.task_id).agent_id == second.agent_id
        assert "reclaimed" in [event.type for event in client.get(handle.task_id).events(timeout=10)]


def test_dlq_tools_and_the_cli_under_their_roles(tenant: Tenant, fleet_of: list[Fleet],
                                                  tmp_path: Path) -> None:
    procs = make_fleet(fleet_of, tenant.settings(Role.AGENT), tmp_path)
    procs.dispatcher(settings=tenant.settings(Role.DISPATCHER))
    worker = procs.worker("bad", handler="tests.handlers:invalid", wait=False)
    procs.wait_healthy(str(worker.agent_id), role_settings(tenant.server.admin_url, tenant.prefix), worker)
    with ReachClient(tenant.settings(Role.PRODUCER)) as client:
        handle = client.submit("bad", {"n": "d"})
        with pytest.raises(Exception, match="invalid_request"):
            handle.result(timeout=60)
    task_id = handle.task_id
    # The reader sees everything...
    letters = json.loads(tenant.cli(Role.READER, "dlq", "list", "--json").stdout)
    assert [letter["task_id"] for letter in letters] == [task_id]
    assert tenant.cli(Role.READER, "dlq", "show", task_id).exit_code == 0
    assert tenant.cli(Role.READER, "dlq", "stats", "--json").exit_code == 0
    assert json.loads(tenant.cli(Role.READER, "status", task_id, "--json").stdout)["state"] == "failed"
    agents = json.loads(tenant.cli(Role.READER, "agents", "--json").stdout)
    assert [a["agent_id"] for a in agents] == [worker.agent_id]
    assert tenant.cli(Role.READER, "queues", "--json").exit_code == 0
    assert task_id in tenant.cli(Role.READER, "tasks", "--json").stdout
    assert tenant.cli(Role.READER, "policy", "show", "bad", "--json").exit_code == 0
    # ...and changes nothing.
    refused(tenant.cli(Role.READER, "submit", "bad", '{"n": 1}'))
    refused(tenant.cli(Role.READER, "dlq", "replay", task_id))
    refused(tenant.cli(Role.READER, "dlq", "purge", task_id))
    # A producer may not run the operators' commands.
    refused(tenant.cli(Role.PRODUCER, "dlq", "purge", task_id))
    refused(tenant.cli(Role.PRODUCER, "policy", "set", "bad", "--max-attempts", "5"))
    still = json.loads(tenant.cli(Role.READER, "dlq", "list", "--json").stdout)
    assert [letter["task_id"] for letter in still] == [task_id]
    # The operator may.
    assert tenant.cli(Role.OPERATOR, "policy", "set", "bad", "--max-attempts", "5").exit_code == 0
    replay = tenant.cli(Role.OPERATOR, "dlq", "replay", task_id)
    assert replay.exit_code == 0, replay.stderr
    wait_until(lambda: json.loads(tenant.cli(Role.READER, "dlq", "list", "--json").stdout), 60,
               message="the replayed task dead-lettered again")
    purge = tenant.cli(Role.OPERATOR, "dlq", "purge", task_id)
    assert purge.exit_code == 0, purge.stderr
    assert json.loads(tenant.cli(Role.READER, "dlq", "list", "--json").stdout) == []


def test_gateway_and_console_under_the_gateway_role_and_a_reader(tenant: Tenant, fleet_of: list[Fleet],
                                                                  tmp_path: Path) -> None:
    procs = make_fleet(fleet_of, tenant.settings(Role.AGENT), tmp_path)
    procs.dispatcher(settings=tenant.settings(Role.DISPATCHER))
    worker = procs.worker("echo", handler="tests.handlers:record", wait=False)
    procs.wait_healthy(str(worker.agent_id), role_settings(tenant.server.admin_url, tenant.prefix), worker)
    _, base = start_gateway(procs, tenant.settings(Role.GATEWAY))
    with httpx.Client(base_url=base, timeout=30) as http:
        submitted = http.post("/v1/tasks", json={"capability": "echo", "payload": {"n": "g"}})
        assert submitted.status_code == 202, submitted.text
        task_id = submitted.json()["task_id"]
        result = http.get(f"/v1/tasks/{task_id}/result", params={"wait": 30})
        assert result.json()["result"] == {"n": "g"}
        for page in ("/v1/agents", "/v1/queues", "/v1/tasks", "/console/agents", "/console/tasks",
                     f"/console/tasks/{task_id}", "/console/dlq", "/console/policy"):
            assert http.get(page).status_code == 200, page
    # A gateway whose Redis user is a reader: reads work, writes are 403 JSON.
    _, read_only = start_gateway(procs, tenant.settings(Role.READER))
    with httpx.Client(base_url=read_only, timeout=30) as http:
        assert http.get(f"/v1/tasks/{task_id}").json()["state"] == "succeeded"
        assert http.get("/console/agents").status_code == 200
        refusal = http.post("/v1/tasks", json={"capability": "echo", "payload": {"n": "r"}})
        assert refusal.status_code == 403
        assert refusal.json()["error"]["code"] == "forbidden"
        assert "lack of permission" in refusal.json()["error"]["message"]


def test_tenant_b_cannot_read_or_write_tenant_a(server: AclServer, tenant: Tenant) -> None:
    other = Tenant(server, f"tb{secrets.token_hex(3)}")
    try:
        with ReachClient(tenant.settings(Role.PRODUCER)) as client:
            handle = client.submit("echo", {"n": 1})
        a_task = RegistryKeys(tenant.prefix).capabilities
        for role in Role:
            b = redis.Redis.from_url(other.urls[role], decode_responses=True)
            try:
                with pytest.raises(redis.exceptions.NoPermissionError):
                    b.smembers(a_task)
                with pytest.raises(redis.exceptions.NoPermissionError):
                    b.sadd(a_task, "stolen")
                with pytest.raises(redis.exceptions.NoPermissionError):
                    b.publish(Channels(tenant.prefix).wake, "x")
                pubsub = b.pubsub()
                with pytest.raises(redis.exceptions.NoPermissionError):
                    pubsub.subscribe(Channels(tenant.prefix).task(handle.task_id))
                    pubsub.get_message(timeout=5)  # (the refusal is the subscribe's reply)
                pubsub.close()
            finally:
                b.close()
        # Tenant B's users pointed at tenant A's prefix: clear errors, nothing read or written.
        with ReachClient(role_settings(other.urls[Role.PRODUCER], tenant.prefix)) as intruder:
            with pytest.raises(PermissionDenied, match="lack of permission"):
                intruder.submit("echo", {"n": 2})
            with pytest.raises(PermissionDenied):
                intruder.status(handle.task_id)
        spy = CliRunner().invoke(app, ["dlq", "list"], catch_exceptions=False, env=settings_env(
            role_settings(other.urls[Role.OPERATOR], tenant.prefix)))
        refused(spy)
        with ReachClient(tenant.settings(Role.PRODUCER)) as client:
            assert client.queue_depth("echo") == 1
    finally:
        other.drop()


def test_processes_without_a_permission_stop_with_a_clear_error(tenant: Tenant, fleet_of: list[Fleet],
                                                                  tmp_path: Path) -> None:
    procs = make_fleet(fleet_of, tenant.settings(Role.READER), tmp_path)
    worker = procs.worker("echo", handler="tests.handlers:record", wait=False)
    dispatcher = procs.dispatcher(settings=tenant.settings(Role.PRODUCER))
    for proc, role in ((worker, "agent"), (dispatcher, "dispatcher")):
        assert proc.wait(60) == 1, proc.output()[-3000:]
        output = proc.output()
        assert "lack of permission" in output and f"role {role}" in output, output[-3000:]
        assert output.count("lack of permission") <= 3, output[-3000:]  # (no retry loop)


def test_the_spine_and_the_reader_under_redis_62_rules(fleet_of: list[Fleet], tmp_path: Path) -> None:
    """The nearest rules of Redis 6.2 (no %R~, no EVALSHA_RO: the read-only scripts fall back
    to EVALSHA) on the embedded 6.2 server."""
    embedded = EmbeddedRedis().start()
    admin = redis.Redis.from_url(embedded.url, decode_responses=True)
    prefix = f"t6{secrets.token_hex(3)}"
    host_port = embedded.url.split("//", 1)[1].split("/", 1)[0]
    urls = {}
    try:
        for role in Role:
            admin.execute_command(*rule(role, prefix, redis_version=6).setuser(password_hash("pw6")).split())
            urls[role] = f"redis://{prefix}-{role}:pw6@{host_port}/0"
        admin.execute_command("ACL", "SETUSER", f"{prefix}-agent", f"~{prefix}:test:*")
        procs = make_fleet(fleet_of, role_settings(urls[Role.AGENT], prefix), tmp_path)
        procs.dispatcher(settings=role_settings(urls[Role.DISPATCHER], prefix))
        worker = procs.worker("bad", handler="tests.handlers:invalid", wait=False)
        procs.wait_healthy(str(worker.agent_id), role_settings(embedded.url, prefix), worker)
        with ReachClient(role_settings(urls[Role.PRODUCER], prefix)) as client:
            handle = client.submit("bad", {"n": "six"})
            with pytest.raises(Exception, match="invalid_request"):
                handle.result(timeout=60)
        env = settings_env(role_settings(urls[Role.READER], prefix))
        letters = CliRunner().invoke(app, ["dlq", "list", "--json"], env=env, catch_exceptions=False)
        assert [row["task_id"] for row in json.loads(letters.stdout)] == [handle.task_id]
        found = CliRunner().invoke(app, ["tasks", "--json"], env=env, catch_exceptions=False)
        assert handle.task_id in found.stdout
        refused(CliRunner().invoke(app, ["dlq", "purge", handle.task_id], env=env, catch_exceptions=False))
    finally:
        for fleet in fleet_of:
            fleet.stop_all()
        for key in admin.scan_iter(match=f"{prefix}:*"):
            admin.unlink(key)
        for role in Role:
            admin.execute_command("ACL", "DELUSER", f"{prefix}-{role}")
        admin.close()
        embedded.stop()


def test_an_agent_reads_the_join_secret_and_cannot_change_it(tenant: Tenant) -> None:
    """register.lua reads the fleet's join-secret verifier without taking it as a key, so that an
    agent's user needs only read access to it: a leaked agent credential cannot set the secret."""
    agent = redis.Redis.from_url(tenant.urls[Role.AGENT], decode_responses=True)
    join = RegistryKeys(tenant.prefix).join_secret
    try:
        assert agent.hgetall(join) == {}
        with pytest.raises(redis.exceptions.NoPermissionError):
            agent.hset(join, "verifier", "0" * 40)
        with pytest.raises(redis.exceptions.NoPermissionError):
            agent.delete(join)
    finally:
        agent.close()
