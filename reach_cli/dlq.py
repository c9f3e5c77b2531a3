"""`reach dlq ...`: inspect, replay and purge dead letters (a thin layer over `dlq_tools.api`).

Errors are one line on stderr; exit 0 ok, 1 runtime failure (Redis away, no such dead letter,
a replay that could not finish), 2 usage (bad flag, bad id, bad duration, conflicting filters).
`--json` prints one JSON array for `list`, one object for everything else (docs/dlq.md).
"""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from broker.retention import trim_all
from dlq_tools import render
from dlq_tools.api import DeadLetters
from dlq_tools.models import Filter, Report
from dlq_tools.parsing import REASONS, parse_time_ms
from dlq_tools.replay import DEFAULT_BATCH, DEFAULT_MAX_QUEUED, DEFAULT_RATE, ReplayOptions
from reach_cli.common import (
    EXIT_RUNTIME,
    ConfigOption,
    JsonOption,
    RedisUrlOption,
    cli_errors,
    confirm,
    console,
    fail,
    load_settings,
    print_json,
    progress,
)

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Inspect, replay and purge the dead-letter streams.")

CapabilityOpt = Annotated[str | None, typer.Option("--capability", "-c", help="Only this capability")]
ReasonOpt = Annotated[str | None, typer.Option("--reason", "-r", help=f"One of: {', '.join(REASONS)}")]
SinceOpt = Annotated[str | None, typer.Option(
    "--since", help="Dead at or after this: a duration back from now (30m, 2h, 7d) or an ISO time")]
AgentOpt = Annotated[str | None, typer.Option("--agent", help="Last agent id")]
IdsArg = Annotated[list[str] | None, typer.Argument(
    help="Task ids, or <capability>/<entry id> (as `list` shows them)", metavar="ID",
    show_default=False)]
AllOpt = Annotated[bool, typer.Option("--all", help="Every dead letter (of --capability, if given)")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Change nothing; say what would happen")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation")]


@contextmanager
def _open(config: Path | None, redis_url: str | None) -> Iterator[DeadLetters]:
    with DeadLetters(load_settings(config, redis_url)) as dlq:
        yield dlq


def _filter(dlq: DeadLetters, capability: str | None, reason: str | None, since: str | None,
            agent: str | None, older_than: str | None = None) -> Filter:
    now = dlq.now_ms() if since or older_than else 0
    return Filter(
        capability=capability, reason=reason, agent=agent,
        since_ms=parse_time_ms(since, now) if since else None,
        until_ms=parse_time_ms(older_than, now) if older_than else None,
    )


def _finish(report: Report, as_json: bool, strict: bool) -> None:
    """Print the report; exit 1 when the run stopped early, or (strict) any entry was not done."""
    if as_json:
        print_json(report.cli_dict())
    else:
        render.report(console, report)
    ok = {"replayed", "would_replay", "purged", "would_purge"}
    if report.stopped:
        fail(f"{report.action} stopped: {report.stopped}", EXIT_RUNTIME)
    bad = [o for o in report.outcomes if o.status not in ok]
    if strict and bad:
        fail(f"{len(bad)} of {report.selected} not {report.action}d: {bad[0].target.ref} "
             f"{bad[0].status} ({bad[0].detail})", EXIT_RUNTIME)


@app.command("list")
@cli_errors
def list_(
    capability: CapabilityOpt = None, reason: ReasonOpt = None, since: SinceOpt = None,
    agent: AgentOpt = None,
    limit: Annotated[int, typer.Option("--limit", "-n", help="Rows per page (1-10000)")] = 50,
    before: Annotated[str | None, typer.Option(
        "--before", help="Next page: the `entry` of the last row shown")] = None,
    as_json: JsonOption = False, redis_url: RedisUrlOption = None, config: ConfigOption = None,
) -> None:
    """Dead letters, newest first, across every capability unless one is named."""
    with _open(config, redis_url) as dlq:
        f = _filter(dlq, capability, reason, since, agent)
        page = dlq.list(f, limit=limit, before=before)
        now = dlq.now_ms()
    if as_json:
        print_json([d.cli_dict(now) for d in page.items])
        return
    if not page.items:
        console.print("No dead letters match." if not f.empty else "The DLQ is empty.")
        return
    render.letters_table(console, page.items, now)
    if page.next_before:
        console.print(f"more: add --before {page.next_before}")


@app.command()
@cli_errors
def show(
    dead_letter_id: Annotated[str, typer.Argument(
        metavar="ID", help="Task id, or <capability>/<entry id>", show_default=False)],
    full: Annotated[bool, typer.Option("--full", help="Show the whole payload")] = False,
    as_json: JsonOption = False, redis_url: RedisUrlOption = None, config: ConfigOption = None,
) -> None:
    """Everything about one dead letter: envelope, payload, every attempt, events."""
    with _open(config, redis_url) as dlq:
        d = dlq.get(dead_letter_id)
        now = dlq.now_ms()
    if as_json:
        print_json(d.cli_dict(now))
    else:
        render.detail(console, d, now, full)


@app.command()
@cli_errors
def stats(
    capability: CapabilityOpt = None,
    top: Annotated[int, typer.Option("--top", help="How many error messages to rank")] = 10,
    as_json: JsonOption = False, redis_url: RedisUrlOption = None, config: ConfigOption = None,
) -> None:
    """Counts by capability and reason, oldest and newest, the most frequent errors."""
    with _open(config, redis_url) as dlq:
        s = dlq.stats(Filter(capability=capability).capability, top=max(0, top))
    if as_json:
        print_json(s.cli_dict())
    else:
        render.stats(console, s)


@app.command()
@cli_errors
def replay(
    ids: IdsArg = None, everything: AllOpt = False, capability: CapabilityOpt = None,
    reason: ReasonOpt = None, since: SinceOpt = None, agent: AgentOpt = None,
    dry_run: DryRunOpt = False,
    priority: Annotated[int | None, typer.Option(help="Run them at this priority (0-9)")] = None,
    reset_attempts: Annotated[bool, typer.Option(
        "--reset-attempts/--keep-attempts", help="Fresh attempt count, or one more try only")] = True,
    yes: YesOpt = False,
    rate: Annotated[float, typer.Option(help="Most tasks requeued per second")] = DEFAULT_RATE,
    batch: Annotated[int, typer.Option(help="Tasks requeued per atomic step")] = DEFAULT_BATCH,
    max_queued: Annotated[int, typer.Option(
        help="Wait while the ready queue holds this many tasks (0: never)")] = DEFAULT_MAX_QUEUED,
    as_json: JsonOption = False, redis_url: RedisUrlOption = None, config: ConfigOption = None,
) -> None:
    """Put dead-lettered tasks back on their queue (same task id, history kept), paced."""
    options = ReplayOptions(priority=priority, reset_attempts=reset_attempts, rate=rate, batch=batch,
                            max_queued=max_queued, dry_run=dry_run)
    with _open(config, redis_url) as dlq:
        refs = ids or []
        f = _filter(dlq, capability, reason, since, agent)
        targets = dlq.select(refs, f=f, everything=everything)
        if not refs and targets:
            confirm(f"Replay {len(targets)} dead letter(s) at up to {rate:g}/s?", dry_run, yes)
        with progress(len(targets), "replaying", not as_json and not dry_run) as step:
            report = dlq.replay(targets, options, on_outcome=step)
    _finish(report, as_json, strict=bool(refs))


@app.command()
@cli_errors
def purge(
    ids: IdsArg = None, everything: AllOpt = False, capability: CapabilityOpt = None,
    reason: ReasonOpt = None, since: SinceOpt = None, agent: AgentOpt = None,
    older_than: Annotated[str | None, typer.Option(
        "--older-than", help="Dead before this: a duration back from now (7d) or an ISO time")] = None,
    dry_run: DryRunOpt = False, yes: YesOpt = False,
    as_json: JsonOption = False, redis_url: RedisUrlOption = None, config: ConfigOption = None,
) -> None:
    """Delete dead letters for good."""
    with _open(config, redis_url) as dlq:
        refs = ids or []
        f = _filter(dlq, capability, reason, since, agent, older_than)
        targets = dlq.select(refs, f=f, everything=everything)
        if not refs and targets:
            confirm(f"Delete {len(targets)} dead letter(s) for good?", dry_run, yes)
        with progress(len(targets), "purging", not as_json and not dry_run) as step:
            report = dlq.purge(targets, dry_run=dry_run, on_outcome=step)
    _finish(report, as_json, strict=bool(refs))


@app.command()
@cli_errors
def export(
    out: Annotated[Path, typer.Option("--out", "-o", help="JSON-lines file to write",
                                      show_default=False)],
    capability: CapabilityOpt = None, reason: ReasonOpt = None, since: SinceOpt = None,
    agent: AgentOpt = None,
    as_json: JsonOption = False, redis_url: RedisUrlOption = None, config: ConfigOption = None,
) -> None:
    """Write dead letters to a JSON-lines file (to `import` elsewhere); the DLQ is unchanged."""
    with _open(config, redis_url) as dlq:
        count = dlq.export(out, _filter(dlq, capability, reason, since, agent))
    if as_json:
        print_json({"exported": count, "file": str(out)})
    else:
        console.print(f"exported {count} dead letter(s) to {out}")


@app.command("import")
@cli_errors
def import_(
    file: Annotated[Path, typer.Argument(help="A file `reach dlq export` wrote", show_default=False)],
    dry_run: DryRunOpt = False,
    as_json: JsonOption = False, redis_url: RedisUrlOption = None, config: ConfigOption = None,
) -> None:
    """Add the dead letters of an export file, skipping those already here."""
    with _open(config, redis_url) as dlq:
        result = dlq.import_(file, dry_run=dry_run)
    if as_json:
        print_json(result.cli_dict())
    else:
        head = "dry run, nothing changed: " if dry_run else ""
        console.print(f"{head}{result.read} read, {result.imported} imported, "
                      f"{result.duplicates} already present")


@app.command()
@cli_errors
def trim(
    capability: CapabilityOpt = None,
    as_json: JsonOption = False, redis_url: RedisUrlOption = None, config: ConfigOption = None,
) -> None:
    """Apply the retention now (dlq_retention_ms; the dispatcher also does it periodically)."""
    from broker.retention import trim as trim_one

    with _open(config, redis_url) as dlq, dlq.conn.errors():
        settings, client = dlq.settings, dlq.conn.redis
        removed = ({capability: trim_one(client, settings, capability)} if capability
                   else trim_all(client, settings))
    if as_json:
        print_json({"removed": removed, "total": sum(removed.values())})
    else:
        console.print(f"removed {sum(removed.values())} dead letter(s) past the retention")
