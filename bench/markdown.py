"""The run as Markdown tables (written next to the JSON; pasted into docs/benchmarks.md).

    python -m bench.markdown bench/results/<stem>.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bench.report import METRICS, RATIO_METRICS, fmt


def _started_by_the_harness(redis: dict[str, Any]) -> str:
    if not redis["embedded"]:
        return ""
    if redis.get("server"):
        return f" (started by the harness from {redis['server']})"
    return " (embedded, started by the harness)"


def _header(meta: dict[str, Any]) -> list[str]:
    machine, sizes, redis = meta["machine"], meta["sizes"], meta["redis"]
    load = meta.get("machine", {}).get("load_average_at_start")
    return [
        f"Run of {meta['started']} (`{meta['command']}`, {meta['duration_s'] / 60:.0f} min): "
        f"{machine['cpu']}, {machine['cores']} cores, {machine['memory_gib']} GiB, Linux "
        f"{machine['kernel']}, Python {machine['python']}; Redis {redis['redis_version']}"
        f"{_started_by_the_harness(redis)}; "
        f"load average at start {', '.join(f'{x:.1f}' for x in load) if load else '?'}"
        f", at end {', '.join(f'{x:.1f}' for x in meta.get('load_average_at_end') or [])}. "
        f"Reach commit `{(meta['git'].get('commit') or '?')[:10]}`"
        f"{' (with uncommitted changes)' if meta['git'].get('reach_code_dirty') else ''}. "
        f"{sizes['n']:,} tasks per enqueue/drain, {sizes['rt_n']} round trips, median of "
        f"{sizes['reps']} repetitions.",
        "",
    ]


def _figure_table(rows: dict[str, Any], agg: dict[str, Any]) -> list[str]:
    shown = [k for k in rows if k in agg]
    out = ["| figure | " + " | ".join(rows[k]["title"] for k in shown) + " |",
           "|---|" + "---:|" * len(shown)]
    for m in METRICS:
        out.append(f"| {m.label} | " + " | ".join(fmt(agg[k][m.key]["median"], m.digits) for k in shown)
                   + " |")
    out.append("")
    for row in rows.values():
        if row.get("note"):
            out.append(f"- {row['title']} ({row['status']}): {row['note']}")
    return out


def _ratio_table(result: dict[str, Any], rows: dict[str, Any]) -> list[str]:
    if not result.get("ratios"):
        return []
    peers = list(result["ratios"])
    labels = {m.key: m.label for m in METRICS}
    out = ["", "Reach / peer, same run:", "",
           "| figure | " + " | ".join(rows[k]["title"] for k in peers) + " |",
           "|---|" + "---:|" * len(peers)]
    for name in RATIO_METRICS:
        out.append(f"| {labels[name]} | " + " | ".join(
            fmt(result["ratios"][k][name], 2) for k in peers) + " |")
    return out


def _dispatcher_rows(dispatcher: dict[str, Any]) -> list[str]:
    out = []
    for agents, d in dispatcher.items():
        util = d["dispatcher_cpu_util"]
        out.append(f"| dispatcher decisions/s, {int(agents):,} agents (process on one core) | "
                   f"{fmt(d['decisions_per_s'])} (dispatcher CPU {fmt(util * 100 if util else None)}%) |")
        out.append(f"| … per dispatcher CPU-second / routing code alone per CPU-second | "
                   f"{fmt(d['decisions_per_cpu_s'])} / {fmt(d['routing_code_decisions_per_cpu_s'])} |")
        if d.get("decisions_per_s_read") is not None:
            out.append(f"| … with stand-in agents reading through the group | "
                       f"{fmt(d['decisions_per_s_read'])} |")
    return out


def _memory_rows(mem: dict[str, Any]) -> list[str]:
    return [
        f"| Redis bytes per queued task beyond its payload ({mem['queued']:,} queued) | "
        f"{fmt(mem['bytes_per_task_beyond_payload'])} |",
        "| … MEMORY USAGE per task: " + ", ".join(
            f"{k} {v:,.0f}" for k, v in mem["breakdown_bytes_per_task"].items()) + " | |",
    ]


def _overhead_rows(over: dict[str, Any]) -> list[str]:
    return [
        f"| 100 ms task: time in the dispatcher p50 / p99 ms | "
        f"{fmt(over['in_dispatcher_ms'], 1)} / {fmt(over['in_dispatcher_p99_ms'], 1)} "
        f"({fmt(over['dispatcher_share_pct'], 1)}%) |",
        f"| 100 ms task: all Reach overhead p50 / p99 ms | "
        f"{fmt(over['total_overhead_ms'], 1)} / {fmt(over['total_overhead_p99_ms'], 1)} "
        f"({fmt(over['overhead_share_pct'], 1)}%) |",
    ]


def _gateway_rows(gw: dict[str, Any]) -> list[str]:
    sse = gw["sse"]
    return [
        f"| gateway: submits/s, one client over keep-alive, one uvicorn process | "
        f"{fmt(gw['submit_per_s'])} (gateway CPU per submit "
        f"{fmt(gw.get('gateway_cpu_us_per_submit'))} µs, client's "
        f"{fmt(gw.get('client_cpu_us_per_submit'))} µs) |",
        f"| gateway: submit + long-poll result round trip p50 ms (Python client's) | "
        f"{fmt(gw['http_round_trip_p50_ms'], 2)} ({fmt(gw['client_round_trip_p50_ms'], 2)}) |",
        f"| gateway: SSE subscribers on one process that got every event of their task | "
        f"{sse['complete']:,} of {sse['subscribers']:,} "
        f"({fmt(sse['seconds_to_all_done'], 1)} s; "
        f"Redis connections added: {sse['redis_clients_added']}) |",
    ]


def _reach_only_table(ro: dict[str, Any], sizes: dict[str, Any]) -> list[str]:
    if not ro:
        return []
    out = ["", "Reach only:", "", "| figure | value |", "|---|---:|"]
    out += _dispatcher_rows(ro.get("dispatcher") or {})
    mem = ro.get("memory")
    if mem:
        out += _memory_rows(mem)
    for depth, value in (ro.get("drain_by_depth") or {}).items():
        out.append(f"| drain /s, 2 workers, {int(depth):,} queued | {fmt(value)} |")
    for workers, value in (ro.get("drain_by_workers") or {}).items():
        out.append(f"| drain /s, {workers} worker process(es), {sizes['n']:,} queued | {fmt(value)} |")
    over = ro.get("overhead_100ms")
    if over:
        out += _overhead_rows(over)
    gw = ro.get("gateway")
    if gw:
        out += _gateway_rows(gw)
    return out


def _targets_table(result: dict[str, Any]) -> list[str]:
    if not result.get("targets"):
        return []
    out = ["", "Targets of issue 7:", "", "| target | measured | goal | met |", "|---|---:|---|---|"]
    for t in result["targets"]:
        met = {True: "yes", False: "**no**", None: "—"}[t["met"]]
        out.append(f"| {t['target']} | {fmt(t['value'], 2)} | {t['goal']} | {met} |")
    return out


def render(result: dict[str, Any]) -> str:
    meta, rows, agg = result["meta"], result["rows"], result["figures"]
    out = _header(meta)
    out += _figure_table(rows, agg)
    out += _ratio_table(result, rows)
    out += _reach_only_table(result.get("reach_only") or {}, meta["sizes"])
    out += _targets_table(result)
    return "\n".join(out) + "\n"


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python -m bench.markdown RESULT.json")
    print(render(json.loads(Path(sys.argv[1]).read_text())), end="")


if __name__ == "__main__":
    main()
