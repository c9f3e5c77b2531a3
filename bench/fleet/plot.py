"""One PNG per scenario: latency over time for every system (matplotlib, if installed).

x is when a task was submitted (seconds after the start), y its latency (log scale). Each task is
a faint dot; a line per system is the p99 of the tasks submitted in each one-second window.
Tasks never seen sit on the top edge. Dashed lines mark the scenario's events.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

from bench.fleet.metrics import percentile

WINDOW_S = 1.0
COLOURS = {"reach": "tab:blue", "reach-tuned": "tab:cyan", "bullmq": "tab:red", "celery": "tab:green",
           "dramatiq": "tab:purple"}


def plot_scenario(path: Path, scenario: dict[str, Any], runs: dict[str, dict[str, Any]],
                  titles: dict[str, str], caption: str) -> str | None:
    """Write the scenario's figure; a note instead when matplotlib is missing or no data."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot (pip install 'agent-reach[bench]')"
    series = {k: v["series"] for k, v in runs.items() if v.get("series")}
    if not series:
        return "nothing to plot"
    top = max((lat for s in series.values() for _, lat in s if lat is not None), default=1000.0) * 1.5
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for key, points in series.items():
        colour = COLOURS.get(key, "tab:gray")
        xs = [x for x, _ in points if x is not None]
        ys = [lat if lat is not None else top for x, lat in points if x is not None]
        ax.scatter(xs, ys, s=3, alpha=0.2, color=colour, linewidths=0, rasterized=True)
        wx, wy = windows(points)
        ax.plot(wx, wy, color=colour, linewidth=1.8 if key.startswith("reach") else 1.2,
                label=f"{titles.get(key, key)} (p99 per {WINDOW_S:g} s)")
    marks = (runs.get("reach") or next(iter(runs.values()))).get("summary", {}).get("marks_s", {})
    for name, at in marks.items():
        ax.axvline(at, color="black", linestyle="--", linewidth=0.8, alpha=0.6)
        ax.text(at, top, f" {name}", fontsize=7, va="top", rotation=90)
    ax.set_yscale("log")
    ax.set_ylim(bottom=5, top=top * 1.1)
    ax.set_xlabel("submitted at (s after the start)")
    ax.set_ylabel("latency, submit -> outcome seen (ms)")
    ax.set_title(f"{scenario['title']}: {scenario['what']}", fontsize=10)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8, loc="upper left")
    fig.text(0.01, 0.005, textwrap.fill(caption, 190), fontsize=6.5, alpha=0.7, va="bottom")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return None


def windows(points: list[list[float | None]]) -> tuple[list[float], list[float]]:
    """(window middle, p99 of the latencies in it) per WINDOW_S of submit time; unseen = inf."""
    buckets: dict[int, list[float]] = {}
    for x, lat in points:
        if x is None:
            continue
        buckets.setdefault(int(max(x, 0.0) // WINDOW_S), []).append(math.inf if lat is None else lat)
    xs, ys = [], []
    for k in sorted(buckets):
        value = percentile(buckets[k], 99)
        if not math.isinf(value):
            xs.append((k + 0.5) * WINDOW_S)
            ys.append(value)
    return xs, ys


def plot_all(result: dict[str, Any], series: dict[str, dict[str, Any]], stem: Path) -> dict[str, str]:
    """A plot per scenario of the run, named `<stem>-<scenario>.png`: path (or note) per scenario."""
    meta = result["meta"]
    titles = {k: v["title"] for k, v in result["systems"].items()}
    caption = f"{meta['command']} — {meta['started']} — commit {(meta['commit'] or '')[:7]} — {meta['cpu']}"
    out = {}
    for scenario in result["scenarios"]:
        runs = {k: {**v, "series": series.get(scenario["key"], {}).get(k)}
                for k, v in result["results"].get(scenario["key"], {}).items()}
        path = stem.with_name(f"{stem.name}-{scenario['key']}.png")
        note = plot_scenario(path, scenario, runs, titles, caption)
        out[scenario["key"]] = str(path) if note is None else note
    return out
