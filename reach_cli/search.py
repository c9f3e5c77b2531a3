"""`reach tasks`: find recent tasks by capability, state, agent, trace and age, newest first."""

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from broker.durations import parse_duration_ms
from broker.errors import BadInput
from broker.models import TaskState, TaskStatus
from broker.ops.search import DEFAULT_LIMIT, MAX_LIMIT, TaskQuery, find_tasks
from reach_cli.common import (
    ConfigOption,
    JsonOption,
    RedisUrlOption,
    cli_errors,
    console,
    load_settings,
    print_json,
    read_redis,
)

STATE_STYLE = {"queued": "cyan", "scheduled": "blue", "dispatched": "cyan", "running": "yellow",
               "retrying": "magenta", "succeeded": "green", "failed": "red", "canceled": "dim"}


def parse_state(text: str | None) -> TaskState | None:
    if not text:
        return None
    try:
        return TaskState(text)
    except ValueError:
        raise BadInput(f"unknown state {text!r}: use one of "
                       f"{', '.join(s.value for s in TaskState)}") from None


@cli_errors
def tasks(
    capability: Annotated[str | None, typer.Option("--capability", "-c", help="Only this capability")] = None,
    state: Annotated[str | None, typer.Option(
        help="queued, scheduled, dispatched, running, retrying, succeeded, failed or canceled")] = None,
    agent: Annotated[str | None, typer.Option(help="Only tasks this agent ran last")] = None,
    since: Annotated[str | None, typer.Option(
        help="Only tasks this recent, e.g. 15m, 1h (failed/canceled: that ended this recently)")] = None,
    trace: Annotated[str | None, typer.Option(help="Only tasks of this trace id")] = None,
    limit: Annotated[int, typer.Option(min=1, max=MAX_LIMIT, help="How many tasks at most")] = DEFAULT_LIMIT,
    cursor: Annotated[str | None, typer.Option(help="Go on from where a listing stopped")] = None,
    as_json: JsonOption = False,
    redis_url: RedisUrlOption = None,
    config: ConfigOption = None,
) -> None:
    """List recent tasks, newest first (kept for the result TTL)."""
    query = TaskQuery(capability=capability, state=parse_state(state), agent_id=agent, trace_id=trace,
                      since_ms=parse_duration_ms(since, "--since") if since else None, limit=limit,
                      cursor=cursor).checked()
    settings = load_settings(config, redis_url)
    page = read_redis(settings, lambda client: find_tasks(client, settings, query))
    if as_json:
        print_json([t.cli_dict() | {"trace_id": t.trace_id} for t in page.tasks])
    else:
        console.print(_table(page.tasks))
    if page.next_cursor:
        typer.echo(f"(more: --cursor {page.next_cursor})", err=True)


def _table(rows: list[TaskStatus]) -> Table:
    table = Table(title=f"Tasks ({len(rows)}, newest first)")
    table.add_column("task", no_wrap=True)
    table.add_column("state", no_wrap=True)
    for column in ("pri", "att", "agent", "created", "took", "reason"):
        table.add_column(column)
    for t in rows:
        style = STATE_STYLE.get(t.state.value, "")
        took = (f"{(t.finished_at - t.created_at).total_seconds():.1f}s"
                if t.finished_at and t.created_at else "-")
        table.add_row(
            t.task_id, f"[{style}]{t.state.value}[/{style}]", str(t.priority), str(t.attempt),
            escape(t.agent_id or "-"), t.created_at.strftime("%H:%M:%S") if t.created_at else "-", took,
            escape(t.reason or "-"))
    return table
