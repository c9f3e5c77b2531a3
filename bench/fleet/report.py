"""The fleet benchmark's tables, the issue's bar, the JSON and the Markdown for the README.

The bar (issue 29), for Reach in every scenario but the healthy one: its p99 within 1.5 x its
own healthy p99, lower than every peer's p99 in the same run, no task failed, none unfinished
and none run twice to effect.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

BAR_FACTOR = 1.5
CHECKS = ("p99_within_1.5x_healthy", "p99_below_every_peer", "none_failed", "none_twice")
COLUMNS = [("completed", "completed"), ("failed", "failed"), ("unfinished", "unfinished"),
           ("twice_to_effect", "ran twice"), ("p50_ms", "p50 ms"), ("p95_ms", "p95 ms"),
           ("p99_ms", "p99 ms"), ("max_ms", "max ms"), ("attempts_mean", "attempts/task"),
           ("touched_bad_pct", "touched bad %")]


def cell(summary: dict[str, Any], key: str) -> str:
    value = summary.get(key)
    if value is None:
        # (a latency of None is infinite: some task never finished before the deadline)
        return "∞" if key.endswith("_ms") else "—"
    if key.endswith("_ms"):
        return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"
    if key == "attempts_mean":
        return f"{value:.2f}"
    if key == "touched_bad_pct":
        return f"{value:.1f}"
    return f"{value:,}"


def bar(results: dict[str, dict[str, Any]], reach_key: str = "reach") -> dict[str, dict[str, Any]]:
    """Per scenario but healthy: whether Reach (or a Reach variant) meets each part of the bar."""
    healthy = (results.get("healthy", {}).get(reach_key) or {}).get("summary")
    out: dict[str, dict[str, Any]] = {}
    for scenario, systems in results.items():
        mine = (systems.get(reach_key) or {}).get("summary")
        if scenario == "healthy" or mine is None:
            continue
        p99 = _inf(mine["p99_ms"])
        peers = {k: _inf(v["summary"]["p99_ms"]) for k, v in systems.items()
                 if not k.startswith("reach") and "summary" in v}
        checks = {
            "p99_within_1.5x_healthy": healthy is not None and p99 <= BAR_FACTOR * _inf(healthy["p99_ms"]),
            "p99_below_every_peer": all(p99 < other for other in peers.values()) if peers else None,
            "none_failed": mine["failed"] == 0 and mine["unfinished"] == 0,
            "none_twice": mine["twice_to_effect"] == 0,
        }
        out[scenario] = {**checks, "met": all(v is not False for v in checks.values()),
                         "p99_ms": mine["p99_ms"],
                         "healthy_p99_ms": healthy["p99_ms"] if healthy else None,
                         "peer_p99_ms": {k: (None if v == float("inf") else v) for k, v in peers.items()}}
    return out


def _inf(value: float | None) -> float:
    return float("inf") if value is None else float(value)


def print_tables(console: Console, result: dict[str, Any]) -> None:
    for scenario in result["scenarios"]:
        key = scenario["key"]
        systems = result["results"].get(key, {})
        table = Table(title=f"{scenario['title']}: {scenario['what']}", title_justify="left")
        table.add_column("system")
        for _, label in COLUMNS:
            table.add_column(label, justify="right")
        for system_key, entry in systems.items():
            title = result["systems"][system_key]["title"]
            if "summary" in entry:
                table.add_row(title, *(cell(entry["summary"], k) for k, _ in COLUMNS))
            else:
                table.add_row(title, f"[red]{entry.get('error', 'no figures')[:80]}[/red]")
        console.print(table)
    for key in ("reach", "reach-tuned"):
        verdicts = bar(result["results"], key)
        for scenario, verdict in verdicts.items():
            failed = [name for name in CHECKS if verdict[name] is False]
            mark = ("[green]meets the bar[/green]" if verdict["met"]
                    else f"[red]misses: {', '.join(failed)}[/red]")
            console.print(f"{result['systems'].get(key, {}).get('title', key)}, {scenario}: {mark}")


def markdown(result: dict[str, Any]) -> str:
    """The compact tables (the README's), then one full table per scenario."""
    lines = [pivot(result)]
    for scenario in result["scenarios"]:
        systems = result["results"].get(scenario["key"], {})
        lines += [f"**{scenario['title']}**: {scenario['what']}", "",
                  "| | " + " | ".join(label for _, label in COLUMNS) + " |",
                  "|---|" + "---:|" * len(COLUMNS)]
        for system_key, entry in systems.items():
            if "summary" in entry:
                title = result["systems"][system_key]["title"]
                cells = " | ".join(cell(entry["summary"], k) for k, _ in COLUMNS)
                lines.append(f"| {title} | {cells} |")
        lines.append("")
    return "\n".join(lines)


PIVOTS: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
          ("p99 ms (max ms)", lambda s: f"{cell(s, 'p99_ms')} ({cell(s, 'max_ms')})"),
          ("failed (dead letters) / ran twice to effect / unfinished",
           lambda s: f"{s['failed']} / {s['twice_to_effect']} / {s['unfinished']}"),
          ("tasks that touched the bad agent %; attempts per task",
           lambda s: f"{cell(s, 'touched_bad_pct')}; {cell(s, 'attempts_mean')}")]


def pivot(result: dict[str, Any]) -> str:
    """The README's compact tables: one figure per system (rows) and scenario (columns)."""
    scenarios = result["scenarios"]
    lines = []
    for label, value in PIVOTS:
        lines += [f"| {label} | " + " | ".join(s["title"] for s in scenarios) + " |",
                  "|---|" + "---:|" * len(scenarios)]
        for key, system in result["systems"].items():
            cells = []
            for s in scenarios:
                entry = result["results"].get(s["key"], {}).get(key, {})
                cells.append(value(entry["summary"]) if "summary" in entry else "—")
            lines.append(f"| {system['title']} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def write_json(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
