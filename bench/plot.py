"""The PNG next to the JSON: drain rate against worker count, and Reach's against queue depth."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot(path: Path, result: dict[str, Any]) -> str | None:
    """Write the figure; returns a note instead when matplotlib is missing or nothing to plot."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot (pip install 'agent-reach[bench]')"
    figures = result.get("figures") or {}
    reach_only = result.get("reach_only") or {}
    if not figures and not reach_only:
        return "nothing to plot"
    fig, (by_workers, by_depth) = plt.subplots(1, 2, figsize=(10, 4))
    for key, row in figures.items():
        points = {1: row["drain_1"]["median"], 2: row["drain_2"]["median"]}
        if key == "reach":
            points.update({int(k): v for k, v in (reach_only.get("drain_by_workers") or {}).items()})
        xs = sorted(k for k, v in points.items() if v)
        if xs:
            by_workers.plot(xs, [points[x] for x in xs], marker="o",
                            label=result["rows"][key]["title"], linewidth=2.5 if key == "reach" else 1.2)
    counts = sorted({1, 2, *(int(k) for k in (reach_only.get("drain_by_workers") or {}))})
    by_workers.set_xticks(counts)
    by_workers.set_xlabel("worker processes")
    by_workers.set_ylabel("tasks/s (drain, median)")
    by_workers.set_title("Drain rate against worker count")
    by_workers.set_yscale("log")
    by_workers.grid(True, which="both", alpha=0.3)
    by_workers.legend(fontsize=8)
    depth = reach_only.get("drain_by_depth") or {}
    if depth:
        xs = sorted(int(d) for d in depth)
        by_depth.plot(xs, [depth[x] for x in xs], marker="o", linewidth=2.5, label="whole drain")
    windows = _largest_windows(result)
    if windows:
        by_depth.plot([w["depth"] for w in windows], [w["rate"] for w in windows], marker=".",
                      linestyle="--", label="10% windows of the largest drain")
    by_depth.set_xscale("log")
    by_depth.set_xlabel("tasks queued when the drain (or window) started")
    by_depth.set_ylabel("tasks/s, 2 Reach workers")
    by_depth.set_title("Reach drain rate against queue depth")
    by_depth.set_ylim(bottom=0)
    by_depth.grid(True, which="both", alpha=0.3)
    if depth or windows:
        by_depth.legend(fontsize=8)
    meta = result.get("meta", {})
    cpu = meta.get("machine", {}).get("cpu", "")
    fig.suptitle(f"Agent-Reach benchmark {meta.get('started', '')} — {cpu}", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def _largest_windows(result: dict[str, Any]) -> list[dict[str, float]]:
    reps = (result.get("reach_extra") or {}).get("depth") or []
    if not reps:
        return []
    points = max(reps[0], key=lambda p: p["depth"], default=None)
    return list(points.get("windows") or []) if points else []
