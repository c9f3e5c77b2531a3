"""Task search over many stored tasks (issue 26): how long `reach tasks` and `GET /v1/tasks`
take to answer filtered queries with 100,000 tasks in Redis. A figure, not a timed test.

    python -m bench.search_bench                  # 100,000 tasks on the embedded Redis
    python -m bench.search_bench --tasks 5000     # smaller
    REDIS_URL=redis://127.0.0.1:6379/0 python -m bench.search_bench   # on that server

The tasks are real: submitted in batches, run by two real workers (2 % fail into the DLQ, one
task carries a trace id nobody else has), then some scheduled, some canceled, some left queued
behind a pause. Each query is timed as the library answers it (the CLI's and the API's work),
over HTTP against one `reach serve` process (keep-alive), and as a whole `reach tasks` process
(Python's start-up included). Every key it made is deleted at the end.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from agent_worker import InvalidRequest, TaskContext
from broker import ReachClient, SubmitOptions
from broker.infra import connection
from broker.infra.embedded import EmbeddedRedis
from broker.keys import CapabilityKeys
from broker.models import TaskState
from broker.ops.search import TaskQuery, search_tasks
from broker.scripts import Scripts
from broker.settings import Settings

CAP = "bsearch"
ROOT = Path(__file__).resolve().parent.parent
RUNS = 15
NEEDLE_TRACE = "0e0d1e00000000000000000000007ace"
"""The trace id of the one task the trace search looks for (a W3C trace id: 32 hex)."""


async def handle(ctx: TaskContext, payload: Any) -> Any:
    if isinstance(payload, dict) and payload.get("fail"):
        raise InvalidRequest("this one fails on purpose")
    return payload


def _env(settings: Settings) -> dict[str, str]:
    env = dict(os.environ, REDIS_URL=settings.redis_url, REACH_PREFIX=settings.prefix,
               REACH_MAX_QUEUE_DEPTH=str(settings.max_queue_depth), PYTHONPATH=str(ROOT))
    env.pop("REACH_CONFIG", None)
    return env


def _spawn(argv: list[str], settings: Settings, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", *argv], env=_env(settings), cwd=ROOT,
                                stdout=out, stderr=subprocess.STDOUT)


def fill(client: ReachClient, settings: Settings, n: int) -> dict[str, Any]:
    """n tasks run through the workers, then scheduled, canceled and queued ones."""
    started = time.monotonic()
    for start in range(0, n, 1000):
        payloads = [{"i": i, "fail": i % 50 == 7} for i in range(start, min(n, start + 1000))]
        client.submit_many(CAP, payloads)
    needle = client.submit(CAP, {"i": -1}, SubmitOptions(trace_id=NEEDLE_TRACE)).task_id
    r = connection.sync_client(settings)
    keys = CapabilityKeys(settings.prefix, CAP)
    while r.zcard(keys.queue) or int(r.hget(keys.stats, "active") or 0) > 0:
        time.sleep(0.5)
    ran_s = time.monotonic() - started
    scheduled = client.submit_many(CAP, [{"later": i} for i in range(500)], SubmitOptions(delay_s=3600))
    for handle_ in scheduled[:200]:
        client.cancel(handle_.task_id)
    client.pause(CAP, "search benchmark")
    client.submit_many(CAP, [{"waits": i} for i in range(500)])
    r.close()
    return {"needle": needle, "ran_s": ran_s}


def _q(name: str, **fields: Any) -> tuple[str, dict[str, Any], dict[str, str]]:
    """A query as the library takes it and as the API's (and the CLI's) parameters say it."""
    names = {"agent_id": "agent", "trace_id": "trace", "since_ms": "since"}
    params = {names.get(k, k): str(v.value if isinstance(v, TaskState) else v) for k, v in fields.items()}
    if "since" in params:
        params["since"] = f"{int(params['since']) // 1000}s"
    return name, {"capability": CAP, **fields}, {"capability": CAP, **params}


QUERIES = [
    _q("newest 50"),
    _q("failed, newest 50", state=TaskState.FAILED),
    _q("succeeded in the last hour", state=TaskState.SUCCEEDED, since_ms=3_600_000),
    _q("queued", state=TaskState.QUEUED),
    _q("scheduled", state=TaskState.SCHEDULED),
    _q("canceled", state=TaskState.CANCELED),
    _q("one agent's, newest 50", agent_id="bench-a"),
    _q("one trace among all (one page)", trace_id=NEEDLE_TRACE),
]


def _ms(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1000:.1f}"


def measure(settings: Settings, url: str) -> list[tuple[str, str, str, int, str, str]]:
    r = connection.sync_client(settings)
    scripts = Scripts(r)
    http = httpx.Client(base_url=url, timeout=30)
    rows = []
    for name, fields, params in QUERIES:
        query = TaskQuery(**fields)
        lib, api = [], []
        page = search_tasks(r, settings, query, scripts=scripts)
        for _ in range(RUNS):
            t = time.perf_counter()
            page = search_tasks(r, settings, query, scripts=scripts)
            lib.append(time.perf_counter() - t)
            t = time.perf_counter()
            reply = http.get("/v1/tasks", params=params)
            api.append(time.perf_counter() - t)
            assert reply.status_code == 200, reply.text
        cli = []
        argv = [sys.executable, "-m", "reach_cli", "tasks", "--json"]
        argv += [x for k, v in params.items() for x in (f"--{k}", v)]
        for _ in range(3):
            t = time.perf_counter()
            subprocess.run(argv, env=_env(settings), cwd=ROOT, capture_output=True, check=True)
            cli.append(time.perf_counter() - t)
        rows.append((name, _ms(lib), _ms(api), len(page.tasks), f"{page.scanned}", _ms(cli)))
    http.close()
    r.close()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    args = parser.parse_args()
    embedded = None
    url = os.environ.get("REDIS_URL")
    if not url:
        embedded = EmbeddedRedis().start()
        url = embedded.url
    settings = Settings.load(redis_url=url, prefix=f"bsearch{secrets.token_hex(3)}",
                             max_queue_depth=args.tasks + 10_000)
    logs = Path(os.environ.get("TMPDIR", "/tmp"))
    procs = [_spawn(["reach_cli", "dispatcher", "--log-level", "WARNING"], settings, logs / "bs-disp.log")]
    for agent in ("bench-a", "bench-b"):
        argv = ["reach_cli.worker", "--capability", CAP, "--handler", "bench.search_bench:handle",
                "--concurrency", "64", "--agent-id", agent, "--log-level", "WARNING"]
        procs.append(_spawn(argv, settings, logs / f"bs-{agent}.log"))
    url_file = logs / f"bs-gateway-{settings.prefix}.url"
    procs.append(_spawn(["reach_cli", "serve", "--addr", "127.0.0.1:0", "--url-file", str(url_file),
                         "--log-level", "WARNING"], settings, logs / "bs-gateway.log"))
    try:
        with ReachClient(settings) as client:
            info = fill(client, settings, args.tasks)
        while not (url_file.exists() and url_file.read_text().strip()):
            time.sleep(0.1)
        rows = measure(settings, url_file.read_text().strip())
        print(f"\n{args.tasks:,} tasks run in {info['ran_s']:.0f} s; then 500 scheduled (200 canceled) "
              f"and 500 queued. Median of {RUNS} (CLI: of 3), ms:\n")
        print("| query | library | GET /v1/tasks | tasks | records read | `reach tasks` process |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for row in rows:
            print("| " + " | ".join(str(x) for x in row) + " |")
        return 0
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(10)
        r = connection.sync_client(settings)
        batch = list(r.scan_iter(match=f"{settings.prefix}:*", count=5000))
        for start in range(0, len(batch), 500):
            for key in batch[start:start + 500]:
                r.unlink(key)
        r.close()
        url_file.unlink(missing_ok=True)
        if embedded is not None:
            embedded.stop()


if __name__ == "__main__":
    sys.exit(main())
