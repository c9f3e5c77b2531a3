"""`reach schedule add|list|pause|resume|remove`: periodic tasks (broker/schedule.py), fired by
the dispatchers, one task per due time however many run."""

from typing import Annotated, Any

import typer
from rich.table import Table

from broker.durations import parse_duration_ms
from broker.ops import schedules
from broker.schedule import Schedule, iso
from reach_cli.common import (
    ConfigOption,
    JsonOption,
    RedisUrlOption,
    cli_errors,
    console,
    load_settings,
    parse_json,
    print_json,
    read_redis,
)

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Periodic tasks.")
NameArg = Annotated[str, typer.Argument(help="Schedule name")]


def _row(schedule: Schedule, last_ms: int) -> dict[str, Any]:
    return {"name": schedule.name, "capability": schedule.capability, "when": schedule.describe(),
            "cron": schedule.cron, "every_ms": schedule.every_ms, "timezone": schedule.timezone,
            "priority": schedule.priority, "paused": schedule.paused, "payload": schedule.payload,
            "last_fire": iso(last_ms), "next_fire": iso(schedule.next_due(last_ms))}


@app.command()
@cli_errors
def add(
    name: NameArg,
    capability: Annotated[str, typer.Option("--capability", "-c", help="Capability of its tasks")],
    payload: Annotated[str, typer.Option(help="The payload of every task, as JSON")],
    cron: Annotated[str | None, typer.Option(help="A cron expression, e.g. '*/5 * * * *'")] = None,
    timezone: Annotated[str, typer.Option(help="The cron's timezone (IANA name)")] = "UTC",
    every: Annotated[str | None, typer.Option(help="Or a fixed interval, e.g. 10s or 1h")] = None,
    priority: Annotated[int, typer.Option(min=0, max=9)] = 5,
    as_json: JsonOption = False, redis_url: RedisUrlOption = None, config: ConfigOption = None,
) -> None:
    """Add a schedule: a task at every due time of a cron expression or an interval."""
    body = parse_json(payload, "--payload")
    schedule = Schedule(name, capability, body, cron=cron, timezone=timezone, priority=priority,
                        every_ms=parse_duration_ms(every, "--every") if every else None).check()
    settings = load_settings(config, redis_url)
    stored = read_redis(settings, lambda client: schedules.add(client, settings, schedule))
    if as_json:
        print_json(_row(stored, stored.created_ms))
    else:
        first = iso(stored.next_due(stored.created_ms))
        console.print(f"schedule {stored.name}: {stored.describe()}, next at {first}")


@app.command("list")
@cli_errors
def list_(as_json: JsonOption = False, redis_url: RedisUrlOption = None, config: ConfigOption = None) -> None:
    """Every schedule, with its last and next due time."""
    settings = load_settings(config, redis_url)
    rows = [_row(s, last) for s, last in read_redis(settings, lambda c: schedules.list_all(c, settings))]
    if as_json:
        print_json(rows)
        return
    table = Table(title=f"Schedules ({len(rows)})")
    for column in ("name", "capability", "when", "priority", "paused", "last", "next"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["name"], row["capability"], row["when"], str(row["priority"]),
                      "yes" if row["paused"] else "", row["last_fire"] or "-", row["next_fire"] or "-")
    console.print(table)


def _set_paused(name: str, paused: bool, as_json: bool, redis_url: str | None, config: Any) -> None:
    settings = load_settings(config, redis_url)
    schedule = read_redis(settings, lambda client: schedules.set_paused(client, settings, name, paused))
    if as_json:
        print_json({"name": schedule.name, "paused": schedule.paused})
    else:
        console.print(f"schedule {name} {'paused' if paused else 'resumed'}")


@app.command()
@cli_errors
def pause(name: NameArg, as_json: JsonOption = False, redis_url: RedisUrlOption = None,
          config: ConfigOption = None) -> None:
    """Make no tasks until resumed (and none for the time it was paused)."""
    _set_paused(name, True, as_json, redis_url, config)


@app.command()
@cli_errors
def resume(name: NameArg, as_json: JsonOption = False, redis_url: RedisUrlOption = None,
           config: ConfigOption = None) -> None:
    """Make tasks again, from the next due time."""
    _set_paused(name, False, as_json, redis_url, config)


@app.command()
@cli_errors
def remove(name: NameArg, as_json: JsonOption = False, redis_url: RedisUrlOption = None,
           config: ConfigOption = None) -> None:
    settings = load_settings(config, redis_url)
    read_redis(settings, lambda client: schedules.remove(client, settings, name))
    if as_json:
        print_json({"name": name, "removed": True})
    else:
        console.print(f"schedule {name} removed")
