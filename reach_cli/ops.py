"""`reach queues`, `reach capabilities`, `reach explain`: what the fleet's queues look like right now
(`reach agents` is reach_cli/agents.py)."""

from typing import Annotated, Any

import typer
from rich.table import Table

from broker.ids import check_capability
from broker.ops.catalog import capability_rows
from broker.ops.overview import queue_rows
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


@cli_errors
def capabilities(
    as_json: JsonOption = False,
    redis_url: RedisUrlOption = None,
    config: ConfigOption = None,
) -> None:
    """List capabilities (named by producers or served by agents): how many agents serve them, and
    what each does (the description its agents registered; --json adds the schemas)."""
    settings = load_settings(config, redis_url)
    rows = read_redis(settings, lambda client: capability_rows(client, settings))
    if as_json:
        print_json([row.as_dict() for row in rows])
        return
    table = Table(title=f"Capabilities ({len(rows)})")
    for column in ("capability", "agents", "healthy", "input", "description"):
        table.add_column(column)
    for row in rows:
        described = row.description
        fields = ", ".join((described.input_schema or {}).get("properties", {})) or "-"
        text = (described.description or "-").split("\n", 1)[0]
        table.add_row(row.capability, str(row.agents), str(row.healthy_agents), fields,
                      text if len(text) <= 80 else text[:77] + "...")
    console.print(table)


@cli_errors
def queues(
    capability: Annotated[str | None, typer.Option(help="Only this capability")] = None,
    as_json: JsonOption = False,
    redis_url: RedisUrlOption = None,
    config: ConfigOption = None,
) -> None:
    """Per capability: queued, delayed, unread in inboxes, running, dead letters, oldest, agents."""
    if capability:
        check_capability(capability)
    settings = load_settings(config, redis_url)
    rows = read_redis(settings, lambda client: queue_rows(client, settings, capability))
    if as_json:
        print_json([row.as_dict() for row in rows])
        return
    table = Table(title="Queues")
    for column in ("capability", "queued", "limit", "delayed", "in inboxes", "running", "DLQ",
                   "oldest", "agents (healthy)"):
        table.add_column(column)
    for row in rows:
        paused = f" [yellow]paused[/yellow]{f' ({row.paused_reason})' if row.paused_reason else ''}" \
            if row.paused else ""
        table.add_row(
            row.capability + paused, str(row.queued), str(row.max_queue_depth), str(row.delayed),
            str(row.unread_in_inboxes), str(row.running), str(row.dead_letters),
            f"{row.oldest_queued_age_s:.1f}s" if row.oldest_queued_age_s is not None else "-",
            f"{row.agents} ({row.healthy_agents})",
        )
    console.print(table)


@cli_errors
def explain(
    task_id: Annotated[str, typer.Argument(help="Task id")],
    as_json: JsonOption = False,
    redis_url: RedisUrlOption = None,
    config: ConfigOption = None,
) -> None:
    """Why a task went to its agent (or why it still waits): candidates, scores, filters."""
    from dispatcher.explain import explain as explain_task

    settings = load_settings(config, redis_url)
    report = read_redis(settings, lambda client: explain_task(client, settings, task_id))
    if as_json:
        print_json(report)
        return
    task = report["task"]
    console.print(f"[bold]{task['task_id']}[/bold]  {task['state']}  priority {task['priority']}  "
                  f"attempt {task['attempt']}  agent {task['agent_id'] or '-'}")
    constraints = {k: v for k, v in report["constraints"].items() if v not in (None, True)}
    if constraints:
        console.print("constraints: " + ", ".join(f"{k}={v}" for k, v in constraints.items()))
    decision = report["decision"]
    if decision:
        console.print(f"last dispatch: to [bold]{decision['agent_id']}[/bold] ({decision['why']}, "
                      f"score {decision['score']}, {decision['eligible']} eligible)")
    if report["round"]:
        _print_round("the round that decided it", report["round"])
    elif decision:
        console.print("(the round's snapshot has expired; only the decision is kept)")
    if report["now"]:
        now = report["now"]
        console.print(f"if routed now: {now['would_go_to'] or '-'} ({now['why']})")
        _print_round("routing now", now["round"])


def _print_round(title: str, snapshot: dict[str, Any]) -> None:
    table = Table(title=title)
    for column in ("agent", "score", "free", "affinity", "latency", "stability", "penalty", "room",
                   "cold", "region", "version"):
        table.add_column(column)
    for c in snapshot["candidates"]:
        table.add_row(c["agent_id"], str(c["score"]), str(c["free"]), str(c["affinity"]),
                      str(c["latency"]), str(c["stability"]), str(c["penalty"]), str(c["room"]),
                      "yes" if c["cold"] else "", c["region"] or "-", c["version"] or "-")
    console.print(table)
    if snapshot.get("more_candidates"):
        console.print(f"… and {snapshot['more_candidates']} more candidates")
    for reason, agents in snapshot["filtered"].items():
        count = snapshot["filtered_counts"][reason]
        more = f" (+{count - len(agents)} more)" if count > len(agents) else ""
        console.print(f"filtered out by {reason}: {', '.join(agents)}{more}")
