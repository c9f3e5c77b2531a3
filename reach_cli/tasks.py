"""`reach submit | status | result | cancel`: one task at a time, from the shell."""

import json
from datetime import datetime
from typing import Annotated

import typer

from broker import ReachClient, SubmitOptions, TaskFailed
from broker.durations import parse_duration_ms
from broker.models import TaskStatus
from broker.ops.cancel import CancelReport
from broker.protocol.submit import build_submit_request
from broker.settings import Settings
from reach_cli.common import (
    EXIT_RUNTIME,
    EXIT_USAGE,
    ConfigOption,
    JsonOption,
    RedisUrlOption,
    cli_errors,
    confirm,
    console,
    fail,
    load_settings,
    parse_json,
    print_json,
    progress,
)


def _show_status(status: TaskStatus, as_json: bool) -> None:
    shown = status.cli_dict() | {"trace_id": status.trace_id}
    if as_json:
        print_json(shown)
        return
    for key, value in shown.items():
        if value is not None:
            console.print(f"[bold]{key:>12}[/bold]  {value}")


@cli_errors
def submit(
    capability: Annotated[str, typer.Argument(help="Capability name, e.g. summarize")],
    payload: Annotated[str, typer.Argument(help="The payload as JSON text")],
    wait: Annotated[bool, typer.Option("--wait", help="Wait for the result and print it")] = False,
    timeout: Annotated[float | None, typer.Option(help="With --wait: give up after N seconds")] = None,
    priority: Annotated[int, typer.Option(help="0-9, higher runs first")] = 5,
    session_id: Annotated[str | None, typer.Option()] = None,
    region: Annotated[str | None, typer.Option()] = None,
    idempotency_key: Annotated[str | None, typer.Option()] = None,
    timeout_s: Annotated[float | None, typer.Option(help="Per-attempt execution timeout")] = None,
    deadline_s: Annotated[float | None, typer.Option(help="Whole-task deadline from now")] = None,
    traceparent: Annotated[str | None, typer.Option(help="W3C traceparent to run the task in")] = None,
    tracestate: Annotated[str | None, typer.Option(help="W3C tracestate (with --traceparent)")] = None,
    trace_id: Annotated[str | None, typer.Option(help="W3C trace id (32 hex) for a new traceparent")] = None,
    metadata: Annotated[str | None, typer.Option(help="JSON object")] = None,
    delay: Annotated[str | None, typer.Option(help="Queue it after this long, e.g. 30s")] = None,
    at: Annotated[str | None, typer.Option(help="Queue it at this time (ISO 8601 with a zone)")] = None,
    as_json: JsonOption = False,
    redis_url: RedisUrlOption = None,
    config: ConfigOption = None,
) -> None:
    """Submit a task; print its id (or, with --wait, its result)."""
    body = parse_json(payload, "payload")
    meta = parse_json(metadata, "--metadata") if metadata is not None else None
    options = SubmitOptions(
        priority=priority, session_id=session_id, region=region, idempotency_key=idempotency_key,
        timeout_s=timeout_s, deadline_s=deadline_s, traceparent=traceparent,
        tracestate=tracestate, trace_id=trace_id, metadata=meta,
        delay_s=parse_duration_ms(delay, "--delay") / 1000 if delay else None,
        at=_aware(at) if at else None)
    settings = load_settings(config, redis_url)
    build_submit_request(settings, capability, body, options)  # (bad input: one line, no warning)
    with ReachClient(settings) as client:
        warning = client.served_warning(capability)
        if warning:
            typer.echo(f"warning: {warning}", err=True)
        handle = client.submit(capability, body, options)
        if not wait:
            if as_json:
                print_json({"task_id": handle.task_id, "created": handle.created})
            else:
                typer.echo(handle.task_id)
            return
        try:
            result = handle.result(timeout=timeout)
        except TaskFailed as exc:
            if as_json:
                print_json({"task_id": handle.task_id, "state": "failed", "reason": exc.reason,
                            "error": exc.error})
            fail(str(exc), EXIT_RUNTIME)
        if as_json:
            print_json({"task_id": handle.task_id, "state": "succeeded", "result": result})
        else:
            typer.echo(json.dumps(result, ensure_ascii=False, indent=2))


@cli_errors
def status(
    task_id: Annotated[str, typer.Argument(help="Task id, as submit printed it")],
    as_json: JsonOption = False,
    redis_url: RedisUrlOption = None,
    config: ConfigOption = None,
) -> None:
    """Show a task's state, attempt, agent and times."""
    with ReachClient(load_settings(config, redis_url)) as client:
        _show_status(client.status(task_id), as_json)


@cli_errors
def result(
    task_id: Annotated[str, typer.Argument()],
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Wait for the task to end")] = True,
    timeout: Annotated[float | None, typer.Option(help="Give up waiting after this many seconds")] = None,
    as_json: JsonOption = False,
    redis_url: RedisUrlOption = None,
    config: ConfigOption = None,
) -> None:
    """Print a task's result (waiting for it by default); exit 1 if it failed."""
    with ReachClient(load_settings(config, redis_url)) as client:
        value = client.result(task_id, timeout=timeout if wait else 0)
    if as_json:
        print_json({"task_id": task_id, "state": "succeeded", "result": value})
    else:
        typer.echo(json.dumps(value, ensure_ascii=False, indent=2))


def _aware(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        fail(f"--at {text!r} is not an ISO 8601 time (e.g. 2026-12-24T18:00:00+01:00)", EXIT_USAGE)
    if moment.tzinfo is None:
        fail(f"--at {text!r} has no timezone: add one (Z, +01:00)", EXIT_USAGE)
    return moment


@cli_errors
def cancel(
    task_id: Annotated[str | None, typer.Argument(help="A task id (or many: --capability)")] = None,
    capability: Annotated[str | None, typer.Option(
        "--capability", "-c", help="Cancel this capability's tasks")] = None,
    states: Annotated[list[str] | None, typer.Option(
        "--state", help="queued, scheduled, retrying or running (repeatable)")] = None,
    older_than: Annotated[str | None, typer.Option(help="Only tasks created longer ago, e.g. 1h")] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Say what would be canceled; change nothing")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation")] = False,
    as_json: JsonOption = False,
    redis_url: RedisUrlOption = None,
    config: ConfigOption = None,
) -> None:
    """Cancel a task wherever it is (queued, waiting for a retry, or running), or many at once."""
    if (task_id is None) == (capability is None):
        fail("give a task id, or --capability (with --state / --older-than) for many", EXIT_USAGE)
    if capability is not None:
        older = parse_duration_ms(older_than, "--older-than") / 1000 if older_than else None
        cancel_many(load_settings(config, redis_url), capability, states or [], older, dry_run, yes, as_json)
        return
    if states or older_than or dry_run:
        fail("--state, --older-than and --dry-run select many tasks: give --capability", EXIT_USAGE)
    assert task_id is not None
    with ReachClient(load_settings(config, redis_url)) as client:
        canceled = client.cancel(task_id)
        state = client.status(task_id).state.value
    if as_json:
        print_json({"task_id": task_id, "canceled": canceled, "state": state})
    elif canceled:
        typer.echo(f"{task_id} canceled")
    else:
        typer.echo(f"{task_id} had already ended ({state}); nothing to cancel")


def cancel_many(settings: Settings, capability: str, states: list[str], older_than_s: float | None,
                dry_run: bool, yes: bool, as_json: bool) -> None:
    """`reach cancel --capability ...`: find the tasks, confirm, cancel them with a progress bar."""
    with ReachClient(settings) as client:
        found = client.cancel_many(capability, states, older_than_s, dry_run=True)
        if dry_run or not found.task_ids:
            _show_cancel(found, as_json, dry_run=True)
            return
        confirm(f"Cancel {found.matched} task(s) of {capability}?", False, yes)
        with progress(found.matched, "canceling", not as_json) as step:
            report = client.cancel_tasks(found.task_ids, step)
    _show_cancel(report, as_json, dry_run=False)


def _show_cancel(report: CancelReport, as_json: bool, dry_run: bool) -> None:
    if as_json:
        print_json({**report.as_dict(), "dry_run": dry_run,
                    **({"task_ids": report.task_ids} if dry_run else {})})
    elif dry_run:
        console.print(f"{report.matched} task(s) would be canceled (dry run: nothing changed)")
        for task_id in report.task_ids[:20]:
            console.print(f"  {task_id}")
        if report.matched > 20:
            console.print(f"  … and {report.matched - 20} more")
    else:
        console.print(f"{report.canceled} canceled, {report.ended} had ended already")
