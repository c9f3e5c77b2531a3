"""The gateway's figures (issue 25), on the same Redis and processes as the Reach row:

- submit: one client, one keep-alive connection, POST /v1/tasks one at a time, with no worker
  running (as the table's enqueue figures): submits per second, one uvicorn process, and the
  CPU time the gateway and the client spent per submit. The client is bench/http1.py, a plain
  socket (httpx would spend as much CPU per request as the gateway, on the same two cores);
- round trip: POST /v1/tasks then GET /v1/tasks/{id}/result?wait=30 (long-poll), sequential,
  with the same client against one echo worker and one dispatcher; its p50 beside the Python
  client's submit(...).result() p50 in the same run, on the same processes;
- SSE fan-out: `subscribers` streams of GET /v1/tasks/{id}/events at once on one gateway process,
  one task each, opened while the tasks wait; then a worker and a dispatcher run them. Every
  stream must receive every event of its task (sequence numbers 1..N, the terminal one last),
  and the gateway's Redis connections must not grow with the streams (one pub/sub fan-out).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx

from bench.context import Bench
from bench.http1 import KeepAlive
from bench.procs import Proc, ProcessFailed
from bench.rows.base import payload
from bench.rows.reach import CAPABILITY, ReachRow
from bench.stats import percentile

SUBSCRIBERS = 1000
SMOKE_SUBSCRIBERS = 50


def start_gateway(bench: Bench, row: ReachRow) -> tuple[Proc, str]:
    url_file = bench.sup.log_dir / f"gateway-{row.ns}.url"
    proc = bench.sup.spawn("reach-gateway", bench.python(
        "reach_cli", "serve", "--addr", "127.0.0.1:0", "--url-file", str(url_file),
        "--log-level", "WARNING"), row.env())
    deadline = time.monotonic() + 60
    while not (url_file.exists() and url_file.read_text().strip()):
        proc.check_alive()
        if time.monotonic() > deadline:
            raise ProcessFailed(f"the gateway did not start in 60s (log: {proc.log_path})")
        time.sleep(0.02)
    return proc, url_file.read_text().strip()


WARM_UP = 200
"""Submits before the timed ones: the connection, the gateway's caches and its first code paths."""


def _submit(http: KeepAlive, i: int) -> str:
    status, body = http.post_json("/v1/tasks", {"capability": CAPABILITY, "payload": payload(i)})
    if status != 202:
        raise ProcessFailed(f"gateway submit answered {status}: {body[:200]!r}")
    return str(json.loads(body)["task_id"])


def submit_rate(url: str, n: int, gateway: Proc) -> dict[str, Any]:
    """Also the gateway's CPU per submit (what one core could do, whatever else the machine
    runs) and the client's (bench/http1.py: it must not be what limits the rate)."""
    with KeepAlive(url) as http:
        for i in range(WARM_UP):
            _submit(http, -1 - i)
        cpu = gateway.cpu_seconds() or 0.0
        client_cpu = time.process_time()
        start = time.perf_counter()
        for i in range(n):
            _submit(http, i)
        elapsed = time.perf_counter() - start
        client_us = (time.process_time() - client_cpu) / n * 1e6
        cpu_us = ((gateway.cpu_seconds() or 0.0) - cpu) / n * 1e6
    return {"n": n, "seconds": round(elapsed, 3), "rate": round(n / elapsed, 1),
            "gateway_cpu_us_per_submit": round(cpu_us, 1),
            "one_core_rate": round(1e6 / cpu_us, 1) if cpu_us > 0 else None,
            "client_cpu_us_per_submit": round(client_us, 1)}


RT_WARM_UP = 10
"""Round trips before the timed ones: the gateway opens its pub/sub and kept connections (the
Python client has connected before its own are timed)."""


def http_round_trips(url: str, n: int) -> list[float]:
    out = []
    with KeepAlive(url) as http:
        for i in range(-RT_WARM_UP, n):
            start = time.perf_counter()
            task_id = _submit(http, i)
            status, body = http.get(f"/v1/tasks/{task_id}/result?wait=30")
            if i >= 0:
                out.append((time.perf_counter() - start) * 1000)
            if status != 200 or json.loads(body).get("state") != "succeeded":
                raise ProcessFailed(f"gateway round trip ended {status}: {body[:200]!r}")
    return out


async def _follow(http: httpx.AsyncClient, task_id: str, opened: asyncio.Event,
                  counter: list[int], total: int) -> list[tuple[int, str]]:
    seen: list[tuple[int, str]] = []
    async with http.stream("GET", f"/v1/tasks/{task_id}/events") as response:
        counter[0] += 1
        if response.status_code != 200:
            raise ProcessFailed(f"GET /v1/tasks/{task_id}/events answered {response.status_code}: "
                                f"{(await response.aread())[:200]!r}")
        if counter[0] == total:
            opened.set()
        event_id, event = 0, ""
        async for line in response.aiter_lines():
            if line.startswith("id:"):
                event_id = int(line[3:])
            elif line.startswith("event:"):
                event = line[6:].strip()
            elif not line and event:
                seen.append((event_id, event))
                event = ""
    return seen


async def _fan_out(bench: Bench, row: ReachRow, url: str, task_ids: list[str]) -> dict[str, Any]:
    r = bench.target.r
    limits = httpx.Limits(max_connections=len(task_ids) + 10)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=300) as http:
        opened, counter = asyncio.Event(), [0]
        clients_before = int(r.info("clients")["connected_clients"])
        streams = [asyncio.create_task(_follow(http, t, opened, counter, len(task_ids))) for t in task_ids]
        await asyncio.wait_for(opened.wait(), 120)
        await asyncio.sleep(0.5)  # (every stream's subscription is on its way to Redis)
        clients_added = int(r.info("clients")["connected_clients"]) - clients_before
        start = time.perf_counter()
        ws = await asyncio.to_thread(row.start_workers, 1)
        try:
            await asyncio.to_thread(row.release, ws)
            results = await asyncio.wait_for(asyncio.gather(*streams), 300)
        finally:
            await asyncio.to_thread(row.stop_workers, ws)
        seconds = time.perf_counter() - start
    expected = [int(s or 0) for (s,) in row.records(task_ids, ("seq",))]
    complete = sum(1 for got, n in zip(results, expected, strict=True)
                   if [seq for seq, _ in got] == list(range(1, n + 1)) and got and got[-1][1] == "succeeded")
    return {"subscribers": len(task_ids), "complete": complete, "events": sum(len(g) for g in results),
            "seconds_to_all_done": round(seconds, 2), "redis_clients_added": clients_added}


def sse_fan_out(bench: Bench, row: ReachRow, url: str, subscribers: int) -> dict[str, Any]:
    with httpx.Client(base_url=url, timeout=60) as http:
        reply = http.post("/v1/tasks/batch", json={"capability": CAPABILITY,
                                                   "payloads": [payload(i) for i in range(subscribers)]})
        task_ids = [t["task_id"] for t in reply.json()["tasks"]]
    return asyncio.run(_fan_out(bench, row, url, task_ids))


def run(bench: Bench, row: ReachRow) -> dict[str, Any]:
    """One repetition of the three figures, each on a fresh namespace."""
    sizes = bench.sizes
    out: dict[str, Any] = {}
    row.begin()
    try:
        gateway, url = start_gateway(bench, row)
        bench.log(f"gateway: {sizes.n:,} submits one at a time over keep-alive")
        out["submit"] = submit_rate(url, sizes.n, gateway)
        gateway.stop()
    finally:
        row.cleanup()
    row.begin()
    try:
        gateway, url = start_gateway(bench, row)
        ws = row.start_workers(1)
        try:
            row.release(ws)
            bench.log(f"gateway: {sizes.rt_n} round trips over HTTP, then with the Python client")
            http_rt = http_round_trips(url, sizes.rt_n)
            client_rt = row.round_trips(sizes.rt_n, ws)
        finally:
            row.stop_workers(ws)
            gateway.stop()
        out["round_trip"] = {"http_p50_ms": round(percentile(http_rt, 50), 3),
                             "client_p50_ms": round(percentile(client_rt, 50), 3),
                             "http_p99_ms": round(percentile(http_rt, 99), 3)}
        out["round_trip"]["difference_ms"] = round(out["round_trip"]["http_p50_ms"]
                                                   - out["round_trip"]["client_p50_ms"], 3)
    finally:
        row.cleanup()
    subscribers = SMOKE_SUBSCRIBERS if bench.opts.smoke else SUBSCRIBERS
    row.begin()
    try:
        gateway, url = start_gateway(bench, row)
        bench.log(f"gateway: {subscribers:,} SSE subscribers on one gateway process")
        out["sse"] = sse_fan_out(bench, row, url, subscribers)
        out["sse"]["gateway_peak_rss_kb"] = gateway.peak_rss_kb()
        gateway.stop()
    finally:
        row.cleanup()
    return out
