"""Turning repetitions into figures: medians, Reach/peer ratios, targets, tables, JSON."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bench.stats import median, ratio, summary


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    higher_is_better: bool
    get: Callable[[dict[str, Any]], float | None]
    digits: int = 0


def _drain(rep: dict[str, Any], which: str) -> float | None:
    value = rep.get(which, {}).get("rate")
    return float(value) if value is not None else None


def _redis(rep: dict[str, Any], field: str) -> float | None:
    value = rep.get("drain_2", {}).get("redis", {}).get(field)
    return float(value) if value is not None else None


def _proc_cpu(rep: dict[str, Any]) -> float | None:
    d = rep.get("drain_2", {})
    if d.get("worker_cpu_us_per_task") is None:
        return None
    return float(d["worker_cpu_us_per_task"]) + float(d.get("helper_cpu_us_per_task") or 0)


def _rss(rep: dict[str, Any]) -> float | None:
    kb = max(rep.get("worker_rss_kb") or 0, rep.get("worker_rss_kb_2") or 0)
    return kb / 1024 if kb else None


METRICS = [
    Metric("enqueue_one", "enqueue 1-by-1 /s", True, lambda r: r.get("enqueue_one")),
    Metric("enqueue_many", "enqueue bulk /s", True, lambda r: r.get("enqueue_many")),
    Metric("drain_1", "drain 1 worker /s", True, lambda r: _drain(r, "drain_1")),
    Metric("drain_2", "drain 2 workers /s", True, lambda r: _drain(r, "drain_2")),
    Metric("rt_p50_ms", "RT p50 ms", False, lambda r: r.get("rt_p50_ms"), 2),
    Metric("rt_p99_ms", "RT p99 ms", False, lambda r: r.get("rt_p99_ms"), 2),
    Metric("worker_rss_mb", "worker peak RSS MB", False, _rss, 1),
    Metric("commands_per_task", "Redis cmds/task", False, lambda r: _redis(r, "commands_per_task"), 1),
    Metric("redis_cpu_us", "Redis CPU µs/task", False, lambda r: _redis(r, "redis_cpu_us_per_task"), 1),
    Metric("process_cpu_us", "process CPU µs/task", False, _proc_cpu, 1),
    Metric("foreign_cpu_pct", "other load on the machine %", False,
           lambda r: r.get("drain_2", {}).get("foreign_cpu_pct"), 0),
]
RATIO_METRICS = ["enqueue_one", "enqueue_many", "drain_1", "drain_2", "rt_p50_ms", "rt_p99_ms",
                 "worker_rss_mb", "redis_cpu_us", "process_cpu_us"]


def aggregate(rows: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per row and metric: median/min/max over the repetitions."""
    out: dict[str, dict[str, Any]] = {}
    for key, row in rows.items():
        reps = row.get("reps") or []
        if not reps:
            continue
        out[key] = {}
        for metric in METRICS:
            values = []
            for rep in reps:
                try:
                    values.append(metric.get(rep))
                except (KeyError, TypeError, ValueError):
                    values.append(None)
            out[key][metric.key] = summary(values, 3)
    return out


def ratios(agg: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Reach / peer for every peer row, from the medians of this run."""
    reach = agg.get("reach")
    if not reach:
        return {}
    out: dict[str, dict[str, float | None]] = {}
    for key, figures in agg.items():
        if key == "reach":
            continue
        out[key] = {}
        for name in RATIO_METRICS:
            value = ratio(reach[name]["median"], figures[name]["median"])
            out[key][name] = round(value, 3) if value is not None else None
    return out


def _med(runs: list[dict[str, Any]], field: str) -> float | None:
    return median([r.get(field) for r in runs])


def _dispatcher_summary(dispatch: dict[str, Any]) -> dict[str, Any]:
    return {
        agents: {
            "decisions_per_s": _med(runs, "decisions_per_s"),
            "dispatcher_cpu_util": _med(runs, "dispatcher_cpu_util"),
            "decisions_per_cpu_s": _med(runs, "decisions_per_cpu_s"),
            "routing_code_decisions_per_cpu_s": _med(
                dispatch["routing_code"].get(agents, []), "decisions_per_cpu_s"),
            # (runs of an older harness have no such figure)
            "decisions_per_s_read": _med(
                (dispatch.get("process_read") or {}).get(agents, []), "decisions_per_s"),
        }
        for agents, runs in dispatch["process"].items()
    }


def _depth_summary(depth: list[Any], extra: dict[str, Any], agg: dict[str, Any]) -> dict[str, Any]:
    """drain_by_depth (with the main run's drain at its own depth) and memory, if measured."""
    by_depth: dict[int, list[float | None]] = {}
    for rep in depth:
        for point in rep:
            by_depth.setdefault(int(point["depth"]), []).append(point.get("rate"))
    reach = agg.get("reach")
    n = extra.get("n")
    if reach and n and n not in by_depth:
        by_depth[int(n)] = list(reach["drain_2"]["values"])
    out: dict[str, Any] = {"drain_by_depth": {d: median(v) for d, v in sorted(by_depth.items())}}
    mems = [p["memory"] for rep in depth for p in rep if "memory" in p]
    if mems:
        out["memory"] = {
            "queued": mems[0]["queued"],
            "bytes_per_task_beyond_payload": median(
                [m["bytes_per_task_beyond_payload"] for m in mems]),
            "payload_bytes_per_task": mems[0]["payload_bytes_per_task"],
            "breakdown_bytes_per_task": mems[-1]["breakdown_bytes_per_task"],
        }
    return out


def _overhead_summary(overhead: list[dict[str, Any]]) -> dict[str, Any]:
    out = {
        name: median([o[name]["p50"] if isinstance(o[name], dict) else o[name] for o in overhead])
        for name in ("in_dispatcher_ms", "to_worker_ms", "result_store_ms", "total_overhead_ms",
                     "round_trip_ms", "dispatcher_share_pct", "overhead_share_pct")
    }
    out["in_dispatcher_p99_ms"] = median([o["in_dispatcher_ms"]["p99"] for o in overhead])
    out["total_overhead_p99_ms"] = median([o["total_overhead_ms"]["p99"] for o in overhead])
    return out


def _gateway_summary(gateway: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "submit_per_s": median([g["submit"]["rate"] for g in gateway]),
        "gateway_cpu_us_per_submit": median([g["submit"].get("gateway_cpu_us_per_submit")
                                             for g in gateway]),
        "client_cpu_us_per_submit": median([g["submit"].get("client_cpu_us_per_submit")
                                            for g in gateway]),
        "http_round_trip_p50_ms": median([g["round_trip"]["http_p50_ms"] for g in gateway]),
        "client_round_trip_p50_ms": median([g["round_trip"]["client_p50_ms"] for g in gateway]),
        "round_trip_difference_ms": median([g["round_trip"]["difference_ms"] for g in gateway]),
        "sse": gateway[-1]["sse"],
    }


def reach_only_summary(extra: dict[str, Any], agg: dict[str, Any]) -> dict[str, Any]:
    """Medians of the Reach-only figures."""
    out: dict[str, Any] = {}
    dispatch = extra.get("dispatch") or {}
    if dispatch:
        out["dispatcher"] = _dispatcher_summary(dispatch)
    depth = extra.get("depth") or []
    if depth:
        out.update(_depth_summary(depth, extra, agg))
    overhead = extra.get("overhead") or []
    if overhead:
        out["overhead_100ms"] = _overhead_summary(overhead)
    gateway = extra.get("gateway") or []
    if gateway:
        out["gateway"] = _gateway_summary(gateway)
    scaling = extra.get("scaling") or {}
    if scaling:
        ordered = sorted(scaling.items(), key=lambda kv: int(kv[0]))
        out["drain_by_workers"] = {int(k): median(v) for k, v in ordered}
    return out


def targets(agg: dict[str, Any], reach_only: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets of issue 7, checked against this run (None: not measured here)."""
    out: list[dict[str, Any]] = []

    def add(name: str, value: float | None, goal: str, ok: bool | None) -> None:
        out.append({"target": name, "value": value, "goal": goal, "met": ok})

    reach = agg.get("reach")
    bull = agg.get("bullmq")
    if reach:
        d2 = reach["drain_2"]["median"]
        best = None
        if bull:
            best = max(filter(None, [bull["drain_1"]["median"], bull["drain_2"]["median"]]), default=None)
        add("two-worker drain above BullMQ's best (same run), /s", d2,
            f"> {best:,.0f}" if best else "> BullMQ (not measured)",
            (d2 > best) if (d2 is not None and best) else None)
        p50, p99 = reach["rt_p50_ms"]["median"], reach["rt_p99_ms"]["median"]
        add("round trip p50, ms", p50, "<= 0.75", None if p50 is None else p50 <= 0.75)
        add("round trip p99, ms", p99, "<= 3", None if p99 is None else p99 <= 3)
    disp = reach_only.get("dispatcher", {}).get("1000")
    if disp:
        value = disp["decisions_per_s"]
        add("dispatcher decisions/s with 1,000 agents", value, ">= 20,000",
            None if value is None else value >= 20_000)
    over = reach_only.get("overhead_100ms")
    if over:
        value = over["dispatcher_share_pct"]
        add("time in the dispatcher, % of a 100 ms task (p50)", value, "<= 5",
            None if value is None else value <= 5)
    mem = reach_only.get("memory")
    if mem:
        value = mem["bytes_per_task_beyond_payload"]
        add(f"Redis bytes per queued task beyond payload ({mem['queued']:,} queued)", value,
            "<= 1024", None if value is None else value <= 1024)
    depth = reach_only.get("drain_by_depth") or {}
    if len(depth) >= 2:
        lo, hi = min(depth), max(depth)
        if depth[lo] and depth[hi]:
            value = depth[hi] / depth[lo]
            add(f"drain at {hi:,} queued / drain at {lo:,} queued", round(value, 3), ">= 0.90",
                value >= 0.9)
    return out


# -- printing ---------------------------------------------------------------------------------


def fmt(value: float | None, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:,.{digits}f}"


def print_tables(console: Console, result: dict[str, Any]) -> None:
    rows, agg, sizes = result["rows"], result["figures"], result["meta"]["sizes"]
    table = Table(title=f"{sizes['n']:,} no-op tasks, median of {sizes['reps']} repetition(s), "
                        "every row on the same Redis", title_justify="left")
    table.add_column("figure")
    shown = [key for key in rows if key in agg]
    for key in shown:
        table.add_column(rows[key]["title"], justify="right")
    for metric in METRICS:
        table.add_row(metric.label, *[fmt(agg[key][metric.key]["median"], metric.digits) for key in shown])
    console.print(table)
    for key, row in rows.items():
        if row.get("note"):
            colour = "dim" if key in agg else "yellow"
            text = escape(f"{row['title']} ({row['status']}): {row['note']}")
            console.print(f"[{colour}]{text}[/{colour}]")
    if result["ratios"]:
        rt = Table(title="Reach / peer, same run (rates: > 1 favours Reach; latency, RSS, CPU: < 1)",
                   title_justify="left")
        rt.add_column("figure")
        for key in result["ratios"]:
            rt.add_column(rows[key]["title"], justify="right")
        labels = {m.key: m.label for m in METRICS}
        for name in RATIO_METRICS:
            rt.add_row(labels[name], *[fmt(values[name], 2) + ("x" if values[name] else "")
                                       for values in result["ratios"].values()])
        console.print(rt)
    ro = result.get("reach_only") or {}
    if ro:
        console.print(reach_only_table(ro))
    if result.get("targets"):
        tt = Table(title="Targets of issue 7", title_justify="left")
        for col in ("target", "value", "goal", "met"):
            tt.add_column(col)
        for row in result["targets"]:
            met = {True: "[green]yes[/green]", False: "[red]no[/red]", None: "—"}[row["met"]]
            tt.add_row(row["target"], fmt(row["value"], 2), row["goal"], met)
        console.print(tt)


def reach_only_table(ro: dict[str, Any]) -> Table:
    t = Table(title="Reach only", title_justify="left")
    t.add_column("figure")
    t.add_column("value", justify="right")
    for agents, d in (ro.get("dispatcher") or {}).items():
        util = d["dispatcher_cpu_util"]
        t.add_row(f"dispatcher decisions/s, {int(agents):,} agents (process, one core)",
                  f"{fmt(d['decisions_per_s'])} (CPU {fmt(util * 100 if util else None)}%)")
        t.add_row("  per dispatcher CPU-second", fmt(d["decisions_per_cpu_s"]))
        t.add_row("  routing code alone, per CPU-second", fmt(d["routing_code_decisions_per_cpu_s"]))
        t.add_row("  with stand-in agents reading through the group", fmt(d.get("decisions_per_s_read")))
    mem = ro.get("memory")
    if mem:
        t.add_row(f"Redis bytes per queued task beyond payload ({mem['queued']:,} queued)",
                  fmt(mem["bytes_per_task_beyond_payload"]))
        for name, value in mem["breakdown_bytes_per_task"].items():
            t.add_row(f"  {name} (MEMORY USAGE)", fmt(value))
    for depth, value in (ro.get("drain_by_depth") or {}).items():
        t.add_row(f"drain /s, 2 workers, {int(depth):,} queued", fmt(value))
    for workers, value in (ro.get("drain_by_workers") or {}).items():
        t.add_row(f"drain /s, {workers} worker process(es)", fmt(value))
    over = ro.get("overhead_100ms")
    if over:
        t.add_row("100 ms task: in the dispatcher, p50 / p99 ms",
                  f"{fmt(over['in_dispatcher_ms'], 1)} / {fmt(over['in_dispatcher_p99_ms'], 1)}")
        t.add_row("  share of the task (p50)", f"{fmt(over['dispatcher_share_pct'], 2)}%")
        t.add_row("100 ms task: all Reach overhead, p50 / p99 ms",
                  f"{fmt(over['total_overhead_ms'], 1)} / {fmt(over['total_overhead_p99_ms'], 1)}")
        t.add_row("  share of the task (p50)", f"{fmt(over['overhead_share_pct'], 2)}%")
    gw = ro.get("gateway")
    if gw:
        sse = gw["sse"]
        t.add_row("gateway: submits/s, one client, keep-alive", fmt(gw["submit_per_s"]))
        t.add_row("  gateway / client CPU per submit µs",
                  f"{fmt(gw.get('gateway_cpu_us_per_submit'))} / {fmt(gw.get('client_cpu_us_per_submit'))}")
        t.add_row("gateway: submit + long-poll round trip p50 ms (client's)",
                  f"{fmt(gw['http_round_trip_p50_ms'], 2)} ({fmt(gw['client_round_trip_p50_ms'], 2)})")
        t.add_row("gateway: SSE streams with every event / opened at once",
                  f"{sse['complete']:,} / {sse['subscribers']:,}")
    return t


def write_json(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
