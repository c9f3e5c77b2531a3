"""Metrics, probes and logs of real processes: /metrics scraped after known work shows exact
counts; two dispatchers agree on the fleet; every dashboard query names a metric the processes
export; /readyz flips when Redis stops and when a worker drains; JSON logs parse line by line
and show no secret."""

from __future__ import annotations

import hashlib
import json
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from broker import ReachClient, SubmitOptions, TaskFailed
from broker.infra.embedded import EmbeddedRedis
from broker.keys import CapabilityKeys, RegistryKeys
from broker.ops.overview import agent_rows
from broker.settings import Settings
from tests.conftest import FAST, ROOT, Fleet, Proc, sync_redis, wait_until

pytestmark = pytest.mark.one_redis

METRICS = ["--metrics-addr", "127.0.0.1:0"]
DASHBOARD = ROOT / "config" / "grafana" / "dashboards" / "reach.json"
HANDLER = "tests.metrics_handlers:mixed"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def metrics_url(proc: Proc, timeout: float = 20) -> str:
    """The base URL its log says it serves metrics on."""
    def find() -> str | None:
        if proc.popen.poll() is not None:
            raise AssertionError(f"{proc.name} exited:\n{proc.output()[-3000:]}")
        found = re.search(r"metrics on (http://\S+)/metrics", proc.output())
        return found.group(1) if found else None

    return str(wait_until(find, timeout, message=f"{proc.name} serving metrics"))


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def scrape(base: str) -> Samples:
    status, text = get(f"{base}/metrics")
    assert status == 200, text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def compose_health_check(base: str) -> int:
    """The exit status of compose.yaml's health check (its python -c) against `base`."""
    text = (ROOT / "compose.yaml").read_text()
    code = re.search(r'"python", "-c",\s*"([^"]+)"', text)
    assert code, "compose.yaml has no python -c health check"
    return subprocess.run([sys.executable, "-c", code.group(1).replace("http://127.0.0.1:9464", base)],
                          capture_output=True, timeout=30).returncode


def own_settings(url: str, prefix: str) -> Settings:
    """The tests' settings on a Redis of the test's own (one it stops, or guards by a password)."""
    return Settings.load(redis_url=url, prefix=prefix, **FAST)


def probe(base: str, path: str) -> tuple[int, dict[str, Any]]:
    status, text = get(f"{base}{path}")
    return status, json.loads(text)


def test_counts_after_known_work_are_exact(make_settings: Any, fleet: Fleet) -> None:
    settings = make_settings()
    cap = "counted"
    dispatcher = fleet.dispatcher(cap, env={"REACH_METRICS_ADDR": "127.0.0.1:0"})
    worker = fleet.worker(cap, handler=HANDLER, concurrency=4, extra_args=METRICS)
    plan = {"ok": 7, "invalid": 3, "boom": 2, "retry": 2, "bad": 1}
    with ReachClient(settings) as client:
        handles = [(do, client.submit(cap, {"do": do, "n": i}, SubmitOptions(max_attempts=3)))
                   for do, n in plan.items() for i in range(n)]
        for do, handle in handles:
            if do == "ok":
                handle.result(timeout=30)
            else:
                with pytest.raises(TaskFailed):
                    handle.result(timeout=30)
    fleet_view = scrape(metrics_url(dispatcher))
    c = {"capability": cap}
    assert value(fleet_view, "reach_tasks_submitted_total", **c) == 15
    assert value(fleet_view, "reach_tasks_finished_total", **c, outcome="succeeded", reason="") == 7
    for reason, n in (("invalid_request", 3), ("failure", 2), ("retries_exhausted", 2), ("bad_result", 1)):
        assert value(fleet_view, "reach_tasks_finished_total", **c, outcome="failed", reason=reason) == n
    assert value(fleet_view, "reach_task_retries_total", **c) == 4  # (2 tasks x 2 retries)
    assert value(fleet_view, "reach_task_reclaims_total", **c) == 0
    dispatched = sum(value(fleet_view, "reach_tasks_dispatched_total", **c, path=p)
                     for p in ("routed", "direct", "pulled"))
    assert dispatched == 15 + 4  # (every attempt was put in an inbox)
    assert value(fleet_view, "reach_dead_letters", **c) == 8
    assert value(fleet_view, "reach_agents", **c, state="healthy") == 1
    assert value(fleet_view, "reach_policy_max_attempts", **c) == settings.max_attempts
    assert value(fleet_view, "reach_redis_up") == 1
    assert value(fleet_view, "reach_routing_decisions_total", **c) >= 1
    agent = {"capability": cap, "agent_id": str(worker.agent_id)}
    own = scrape(metrics_url(worker))
    outcomes = {"success": 7, "invalid_request": 3, "failure": 2, "retryable_failure": 6, "bad_result": 1}
    for outcome, n in outcomes.items():
        assert value(own, "reach_agent_tasks_total", **agent, outcome=outcome) == n, outcome
    assert value(own, "reach_agent_task_seconds_count", **agent) == 19
    assert value(own, "reach_agent_queue_wait_seconds_count", **agent) == 19
    assert value(own, "reach_agent_slots", agent_id=str(worker.agent_id)) == 4
    assert value(own, "reach_agent_state", agent_id=str(worker.agent_id), state="healthy") == 1
    check_dashboard({name for name, _ in fleet_view} | {name for name, _ in own})


def check_dashboard(exported: set[str]) -> None:
    """Every query of the Grafana dashboard names metrics a live /metrics exports."""
    queries = [target["expr"] for panel in json.loads(DASHBOARD.read_text())["panels"]
               for target in panel.get("targets", [])]
    assert len(queries) >= 8
    for query in queries:
        names = set(re.findall(r"\b(reach_[a-z_]+)\b", query))
        assert names, query
        for name in names:
            assert name in exported, f"{name} (in {query!r}) is not exported"


def test_a_reclaim_after_sigkill_is_counted_once(make_settings: Any, fleet: Fleet, r: redis.Redis) -> None:
    settings = make_settings()
    cap = "reclaimed"
    dispatcher = fleet.dispatcher(cap, env={"REACH_METRICS_ADDR": "127.0.0.1:0"})
    doomed = fleet.worker(cap, handler=HANDLER, concurrency=1)
    with ReachClient(settings) as client:
        handle = client.submit(cap, {"s": 60})
        wait_until(lambda: handle.status().state == "running", message="the task running")
        doomed.kill()
        fleet.worker(cap, handler=HANDLER, concurrency=1)
        # (its second attempt sleeps as long: end it by a cancel once it runs there)
        wait_until(lambda: handle.status().attempt == 2 and handle.status().state == "running",
                   timeout=30, message="the task reclaimed and running again")
        assert client.cancel(handle.task_id)
    base = metrics_url(dispatcher)
    view = scrape(base)
    c = {"capability": cap}
    assert value(view, "reach_task_reclaims_total", **c) == 1
    assert value(view, "reach_task_retries_total", **c) == 0
    assert value(view, "reach_tasks_finished_total", **c, outcome="canceled", reason="") == 1
    # Both agents' states as `reach agents` judges them, and the fleet's gauges agree.
    rows = agent_rows(sync_redis(settings.redis_url), settings, cap)
    for state in ("healthy", "offline", "suspect"):
        assert value(view, "reach_agents", **c, state=state) == sum(row.state == state for row in rows)


def test_two_dispatchers_report_the_same_fleet(make_settings: Any, fleet: Fleet) -> None:
    settings = make_settings()
    env = {"REACH_METRICS_ADDR": "127.0.0.1:0"}
    first, second = fleet.dispatcher(env=env), fleet.dispatcher(env=env)
    fleet.worker("shared", handler=HANDLER, concurrency=2)
    with ReachClient(settings) as client:
        for i in range(6):
            client.run("shared", {"n": i}, timeout=30)
        client.submit_many("nobody", [{"n": i} for i in range(4)])  # (queued: no agent serves it)
    bases = [metrics_url(first), metrics_url(second)]

    def fleet_of(base: str) -> Samples:
        return {k: v for k, v in scrape(base).items()
                if k[0].startswith("reach_") and not k[0].startswith("reach_routing_")
                and k[0] != "reach_oldest_queued_age_seconds"}  # (an age moves between scrapes)

    one = fleet_of(bases[0])
    assert one == fleet_of(bases[1])
    assert value(one, "reach_tasks_finished_total", capability="shared", outcome="succeeded", reason="") == 6
    assert value(one, "reach_queue_depth", capability="nobody") == 4
    assert value(one, "reach_tasks_submitted_total", capability="nobody") == 4


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
def test_json_logs_parse_and_show_no_secret(tmp_path: Path, prefix: str, sync: bool) -> None:
    password = "pw-" + hashlib.sha1(str(tmp_path).encode()).hexdigest()[:12]
    server = EmbeddedRedis().start()
    try:
        redis.Redis(port=server.port).config_set("requirepass", password)
        settings = own_settings(f"redis://:{password}@127.0.0.1:{server.port}/0", prefix)
        fleet = Fleet(settings, tmp_path)
        try:
            _json_log_run(fleet, settings, password, sync)
        finally:
            fleet.stop_all()
    finally:
        server.stop()


def _json_log_run(fleet: Fleet, settings: Settings, password: str, sync: bool) -> None:
    cap = "logged"
    json_env = {"REACH_LOG_FORMAT": "json"}
    dispatcher = fleet.dispatcher(cap, env=json_env, log_level="DEBUG")
    handler = "tests.metrics_handlers:mixed_sync" if sync else HANDLER
    worker = fleet.worker(cap, handler=handler, concurrency=2, env=json_env)
    r = sync_redis(settings.redis_url)
    shas: set[str] = set()
    ck, rk = CapabilityKeys(settings.prefix, cap), RegistryKeys(settings.prefix)

    def note_tokens() -> None:
        shas.update(v for k, v in r.hgetall(ck.tokens).items() if not k.startswith(("draining:", "refused:")))

    with ReachClient(settings) as client:
        ok = client.submit(cap, {"do": "ok", "n": 1})
        failed = client.submit(cap, {"do": "boom"})
        assert ok.result(timeout=30) == {"ok": 1}
        with pytest.raises(TaskFailed):
            failed.result(timeout=30)
        note_tokens()
        # The registry forgets the agent: its next calls are refused and it registers again.
        first = set(shas)
        # (its record goes too: a live id's record would keep its id for the process holding it)
        r.hdel(ck.tokens, str(worker.agent_id))
        r.delete(rk.agent(str(worker.agent_id)))
        r.zrem(rk.agents, str(worker.agent_id))
        wait_until(lambda: (note_tokens(), shas - first)[1], timeout=30, message="registered again")
        assert client.run(cap, {"do": "ok", "n": 2}, timeout=30) == {"ok": 2}
    worker.signal(signal.SIGTERM)
    worker.wait(30)
    lines = {proc.name: proc.output().splitlines() for proc in (dispatcher, worker)}
    about = []
    for name, text in lines.items():
        assert text, name
        for line in text:
            entry = json.loads(line)  # (every line is one JSON object)
            assert {"time", "level", "logger", "message"} <= set(entry), line
            if "task_id" in entry:
                about.append(entry)
    assert any(e["message"].startswith("handling") and e["logger"] == "tests.handler" for e in about)
    for entry in about:
        assert {"trace_id", "capability", "attempt", "agent_id"} <= set(entry), entry
        assert re.fullmatch(r"[0-9a-f]{32}", entry["trace_id"]), entry
    everything = "\n".join("\n".join(text) for text in lines.values())
    assert password not in everything
    assert len(shas) >= 2
    for candidate in set(re.findall(r"[A-Za-z0-9_-]{32}", everything)):
        assert hashlib.sha1(candidate.encode()).hexdigest() not in shas, "an agent token was logged"


def test_probes_flip_when_redis_stops_and_when_a_worker_drains(tmp_path: Path, prefix: str) -> None:
    server = EmbeddedRedis().start()
    try:
        settings = own_settings(server.url, prefix)
        fleet = Fleet(settings, tmp_path)
        try:
            _probe_run(fleet, settings, server)
        finally:
            fleet.stop_all()
    finally:
        server.stop()


def _probe_run(fleet: Fleet, settings: Settings, server: EmbeddedRedis) -> None:
    cap = "probed"
    dispatcher = metrics_url(fleet.dispatcher(cap, env={"REACH_METRICS_ADDR": "127.0.0.1:0"}))
    proc = fleet.worker(cap, handler=HANDLER, concurrency=2, extra_args=METRICS)
    worker = metrics_url(proc)

    def status(base: str, path: str) -> int:
        return probe(base, path)[0]

    for base in (dispatcher, worker):
        wait_until(lambda b=base: status(b, "/readyz") == 200, message="ready")
        assert status(base, "/healthz") == 200
        assert compose_health_check(base) == 0
    server.kill()
    for base in (dispatcher, worker):
        wait_until(lambda b=base: status(b, "/readyz") == 503, message="not ready without Redis")
        assert probe(base, "/readyz")[1]["checks"]["redis"] is False
        assert status(base, "/healthz") == 200  # (alive all the same)
        assert compose_health_check(base) != 0
    assert value(scrape(dispatcher), "reach_redis_up") == 0
    server.start()
    for base in (dispatcher, worker):
        wait_until(lambda b=base: status(b, "/readyz") == 200, timeout=30, message="ready again")
    with ReachClient(settings) as client:
        handle = client.submit(cap, {"s": 3})
        wait_until(lambda: handle.status().state == "running", message="a task running")
        proc.signal(signal.SIGTERM)  # (it drains: finishes the task first)
        wait_until(lambda: status(worker, "/readyz") == 503, message="not ready while draining")
        checks = probe(worker, "/readyz")[1]["checks"]
        assert checks["not_draining"] is False
        assert status(worker, "/healthz") == 200
        assert handle.result(timeout=30) == {"ok": None}
    assert proc.wait(30) == 0
    status_code, body = probe(dispatcher, "/nowhere")
    assert status_code == 404 and "error" in body
