"""`reach policy show|set|reset|history` and `reach pause|resume`: the fleet's policy, per
capability (broker/policy.py). Every flag is checked before anything is written."""

from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.table import Table

from broker import ReachClient
from broker.durations import parse_duration_ms
from broker.errors import BadInput
from broker.ids import check_capability
from broker.ops.policy import describe
from broker.policy import FIELDS, parse_rate
from broker.protocol.policy import Change
from reach_cli.common import (
    ConfigOption,
    JsonOption,
    RedisUrlOption,
    cli_errors,
    console,
    load_settings,
    print_json,
)

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Show and change the policy the fleet applies to a capability's tasks.")

CapArg = Annotated[str | None, typer.Argument(help="Capability (none with --global)", show_default=False)]
GlobalOpt = Annotated[bool, typer.Option("--global", help="The fleet's defaults, for every capability")]


def _target(capability: str | None, fleet: bool) -> str | None:
    if fleet == (capability is not None):
        raise BadInput("name a capability, or give --global for the fleet's defaults (one of them)")
    return check_capability(capability) if capability is not None else None


def _client(config: Any, redis_url: str | None) -> ReachClient:
    return ReachClient(load_settings(config, redis_url))


def _show_changes(changes: list[Change], as_json: bool) -> None:
    if as_json:
        print_json([{"field": c.field, "old": c.old or None, "new": c.new or None} for c in changes])
    elif not changes:
        console.print("nothing changed")
    for change in [] if as_json else changes:
        console.print(f"{change.field}: {change.old or '-'} -> {change.new or '(inherited)'}")


@app.command()
@cli_errors
def show(capability: CapArg = None, fleet: GlobalOpt = False, as_json: JsonOption = False,
         redis_url: RedisUrlOption = None, config: ConfigOption = None) -> None:
    """Every field with its value and where it came from (default, config, set)."""
    with _client(config, redis_url) as client:
        policy = client.policy(check_capability(capability) if capability else None)
    rows = describe(policy)
    if as_json:
        print_json({"capability": capability, "fields": rows})
        return
    table = Table(title=f"Policy of {capability or 'the fleet (defaults)'}")
    for column in ("field", "value", "default", "from"):
        table.add_column(column)
    for row in rows:
        changed = row["value"] != row["default"]
        value = f"[bold]{row['value']}[/bold]" if changed else str(row["value"])
        table.add_row(row["field"], value, str(row["default"]), row["source"] + _when(row["set_at"]))
    console.print(table)


def _when(ms: int | None) -> str:
    return f" at {datetime.fromtimestamp(ms / 1000, tz=UTC):%Y-%m-%d %H:%M:%S}Z" if ms else ""


def _fields(max_attempts: int | None, timeout: str | None, aging: str | None,
            max_queue_depth: int | None, no_agent_timeout: str | None, rate: str | None,
            burst: int | None, max_running: int | None, retry_failures: bool | None) -> dict[str, Any]:
    values: dict[str, Any] = {
        "max_attempts": max_attempts, "max_queue_depth": max_queue_depth, "burst": burst,
        "max_running": max_running, "retry_failures": retry_failures,
        "timeout_ms": parse_duration_ms(timeout, "--timeout") if timeout else None,
        "aging_ms": parse_duration_ms(aging, "--aging") if aging else None,
        "rate": parse_rate(rate) if rate else None,
    }
    if no_agent_timeout is not None:
        values["no_agent_timeout_ms"] = 0 if no_agent_timeout in ("0", "off") else \
            parse_duration_ms(no_agent_timeout, "--no-agent-timeout")
    return {name: value for name, value in values.items() if value is not None}


@app.command("set")
@cli_errors
def set_(
    capability: CapArg = None, fleet: GlobalOpt = False,
    max_attempts: Annotated[int | None, typer.Option(min=1, max=100, help="Attempts in all")] = None,
    timeout: Annotated[str | None, typer.Option(help="Default execution timeout, e.g. 60s")] = None,
    aging: Annotated[str | None, typer.Option(help="A waiting task gains a level per, e.g. 30s")] = None,
    max_queue_depth: Annotated[int | None, typer.Option(min=1, help="Submits refused beyond")] = None,
    no_agent_timeout: Annotated[str | None, typer.Option(
        help="Fail a task no agent starts within, e.g. 5m (0: never)")] = None,
    rate: Annotated[str | None, typer.Option(help="Most starts per second, e.g. 20/s or 100/m")] = None,
    burst: Annotated[int | None, typer.Option(min=1, help="Starts the rate allows at once")] = None,
    max_running: Annotated[int | None, typer.Option(min=1, help="Most tasks handed out at once")] = None,
    retry_failures: Annotated[bool | None, typer.Option(
        "--retry-failures/--no-retry-failures", help="Retry unclassified handler exceptions")] = None,
    as_json: JsonOption = False, redis_url: RedisUrlOption = None, config: ConfigOption = None,
) -> None:
    """Set fields of a capability's policy (or, with --global, the fleet's defaults)."""
    target = _target(capability, fleet)
    values = _fields(max_attempts, timeout, aging, max_queue_depth, no_agent_timeout, rate, burst,
                     max_running, retry_failures)
    if not values:
        raise BadInput("nothing to set: give at least one field (see --help)")
    with _client(config, redis_url) as client:
        _show_changes(client.set_policy(target, **values), as_json)


@app.command()
@cli_errors
def reset(
    capability: CapArg = None,
    fields: Annotated[list[str] | None, typer.Argument(
        help=f"Fields ({', '.join(FIELDS)}); all if none")] = None,
    fleet: GlobalOpt = False, as_json: JsonOption = False, redis_url: RedisUrlOption = None,
    config: ConfigOption = None,
) -> None:
    """Reset fields to what they inherit (a capability's to the fleet's, the fleet's to the defaults)."""
    target = _target(capability, fleet)
    with _client(config, redis_url) as client:
        _show_changes(client.reset_policy(target, *(fields or [])), as_json)


@app.command()
@cli_errors
def history(capability: CapArg = None, fleet: GlobalOpt = False,
            limit: Annotated[int, typer.Option(min=1, max=1000)] = 50, as_json: JsonOption = False,
            redis_url: RedisUrlOption = None, config: ConfigOption = None) -> None:
    """Every change of the policy, newest first: who, when, old -> new."""
    target = _target(capability, fleet)
    with _client(config, redis_url) as client:
        rows = client.policy_history(target, limit)
    if as_json:
        print_json(rows)
        return
    table = Table(title=f"Policy changes of {capability or 'the fleet'}")
    for column in ("at", "field", "old", "new", "who", "change"):
        table.add_column(column)
    for row in rows:
        table.add_row(_when(row["at"]).removeprefix(" at "), row["field"], row["old"] or "-",
                      row["new"] or "-", row["who"], row["change"])
    console.print(table)


@cli_errors
def pause(
    capability: Annotated[str, typer.Argument(help="Capability")],
    reason: Annotated[str, typer.Option(help="Why (shown by reach queues)")] = "",
    as_json: JsonOption = False, redis_url: RedisUrlOption = None, config: ConfigOption = None,
) -> None:
    """Start nothing of a capability until resumed (submits still queue; running tasks finish)."""
    with _client(config, redis_url) as client:
        _show_changes(client.pause(check_capability(capability), reason), as_json)


@cli_errors
def resume(
    capability: Annotated[str, typer.Argument(help="Capability")],
    as_json: JsonOption = False, redis_url: RedisUrlOption = None, config: ConfigOption = None,
) -> None:
    """Let a paused capability's tasks start again."""
    with _client(config, redis_url) as client:
        _show_changes(client.resume(check_capability(capability)), as_json)
