"""Reach-only figures: drain against worker count and queue depth, Redis memory per queued
task, and the time a 100 ms task spends in Reach (dispatcher and total overhead).

Each runs on fresh namespaces with the same processes and settings as the table's Reach row.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from typing import Any

import redis

from bench.context import Bench
from bench.rows.base import payload
from bench.rows.reach import CAPABILITY, ReachRow
from bench.stats import percentile
from broker import codec

OVERHEAD_HANDLER = "bench.reach_extra:sleep_100ms"
TASK_MS = 100


async def sleep_100ms(ctx: Any, payload: Any) -> Any:
    """A task that works for 100 ms (the handler of the overhead figure)."""
    await asyncio.sleep(TASK_MS / 1000)
    return payload


# -- drain against worker count --------------------------------------------------------------


def drain_with(row: ReachRow, n: int, workers: int) -> dict[str, Any]:
    """Queue n tasks with submit_many, then drain them with `workers` worker processes."""
    row.begin()
    try:
        row.enqueue(n, bulk=True)
        ws = row.start_workers(workers)
        try:
            return row.measured_drain(n, ws)
        finally:
            row.stop_workers(ws)
    finally:
        row.cleanup()


def scaling(bench: Bench, row: ReachRow, counts: list[int]) -> dict[int, float | None]:
    out = {}
    for k in counts:
        bench.log(f"Reach scaling: drain {bench.sizes.n:,} with {k} workers")
        out[k] = drain_with(row, bench.sizes.n, k)["rate"]
    return out


# -- drain against queue depth, and memory per queued task -----------------------------------


def memory_breakdown(bench: Bench, row: ReachRow, n: int, sample: int = 200) -> dict[str, float]:
    """Bytes per task of each key kind (MEMORY USAGE), from a sample of task records (the
    record holds the task's events too)."""
    r = bench.target.r
    ids = [t.split(":", 1)[1] for t in row.task_ids[:sample]]
    pipe = r.pipeline(transaction=False)
    for local in ids:
        pipe.memory_usage(row.keys.task(local), samples=0)
    sizes = pipe.execute()
    queue = r.memory_usage(row.keys.queue, samples=0) or 0
    feed = r.memory_usage(row.keys.events, samples=0) or 0
    return {
        "task_hash": round(statistics.mean(sizes), 1),
        "queue_zset_entry": round(queue / n, 1),
        "event_feed_share": round(feed / n, 1),
    }


def memory_and_drain(bench: Bench, row: ReachRow, depth: int, *, memory: bool) -> dict[str, Any]:
    """Queue `depth` tasks (measuring Redis memory if asked), then drain them with 2 workers."""
    row.begin()
    out: dict[str, Any] = {"depth": depth}
    try:
        r = bench.target.r
        if memory:
            with contextlib.suppress(redis.RedisError):
                r.memory_purge()
            before = bench.target.used_memory()
        row.enqueue(depth, bulk=True)
        if memory:
            after = bench.target.used_memory()
            payload_bytes = sum(len(codec.dumps(payload(i)).encode()) for i in range(depth))
            out["memory"] = {
                "queued": depth,
                "used_memory_delta": after - before,
                "payload_bytes_per_task": round(payload_bytes / depth, 1),
                "bytes_per_task_beyond_payload": round((after - before - payload_bytes) / depth, 1),
                "breakdown_bytes_per_task": memory_breakdown(bench, row, depth),
            }
        ws = row.start_workers(2)
        try:
            out.update(row.measured_drain(depth, ws))
        finally:
            row.stop_workers(ws)
        if memory or depth >= 10_000:
            out["windows"] = drain_windows(row, depth)
    finally:
        row.cleanup()
    return out


def drain_windows(row: ReachRow, n: int, parts: int = 10) -> list[dict[str, float]]:
    """The drain cut into `parts` equal runs of completions: rate in each, by queue depth."""
    finished = sorted(float(f[0]) for f in row.records(row.task_ids[-n:], ("finished_at",)))
    size = n // parts
    out = []
    for k in range(parts):
        chunk = finished[k * size:(k + 1) * size]
        span = (chunk[-1] - chunk[0]) / 1000 if len(chunk) > 1 else 0
        out.append({"depth": n - k * size, "rate": round((len(chunk) - 1) / span, 1) if span else 0.0})
    return out


def depth_series(bench: Bench, row: ReachRow, depths: list[int]) -> list[dict[str, Any]]:
    biggest = max(depths)
    out = []
    for depth in depths:
        bench.log(f"Reach depth: {depth:,} queued, 2 workers"
                  + (" (and Redis memory per task)" if depth == biggest else ""))
        out.append(memory_and_drain(bench, row, depth, memory=depth == biggest))
    return out


# -- overhead on a 100 ms task ---------------------------------------------------------------


def overhead(bench: Bench, row: ReachRow, n: int) -> dict[str, Any]:
    """n sequential 100 ms tasks on one idle worker: where the time beyond the 100 ms goes.

    From the task record (server clock, ms): in the dispatcher = dispatched_at - created_at;
    to the worker = started_at - dispatched_at; result = finished_at - started_at - exec_ms.
    Total overhead = the producer's submit -> result() time minus the handler's exec_ms.
    """
    row.begin()
    try:
        ws = row.start_workers(1, handler=OVERHEAD_HANDLER)
        try:
            row.release(ws)
            assert row.client is not None
            row.client.run(CAPABILITY, payload(-1), timeout=60)  # the dispatcher is up
            rts, ids = [], []
            for i in range(n):
                start = time.perf_counter()
                handle = row.client.submit(CAPABILITY, payload(i))
                handle.result(timeout=30)
                rts.append((time.perf_counter() - start) * 1000)
                ids.append(handle.task_id)
        finally:
            row.stop_workers(ws)
        fields = ("created_at", "dispatched_at", "started_at", "finished_at", "exec_ms")
        recs = [[float(x) for x in rec] for rec in row.records(ids, fields)]
    finally:
        row.cleanup()
    parts = {
        "in_dispatcher_ms": [r[1] - r[0] for r in recs],
        "to_worker_ms": [r[2] - r[1] for r in recs],
        "result_store_ms": [r[3] - r[2] - r[4] for r in recs],
        "exec_ms": [r[4] for r in recs],
        "total_overhead_ms": [rt - r[4] for rt, r in zip(rts, recs, strict=True)],
        "round_trip_ms": rts,
    }
    out: dict[str, Any] = {}
    for name, values in parts.items():
        out[name] = {"p50": round(percentile(values, 50), 2), "p99": round(percentile(values, 99), 2)}
    out["dispatcher_share_pct"] = round(out["in_dispatcher_ms"]["p50"] / TASK_MS * 100, 2)
    out["overhead_share_pct"] = round(out["total_overhead_ms"]["p50"] / TASK_MS * 100, 2)
    return out
