"""`reach submit | status | result | cancel`: one task at a time, from the shell."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from broker import ReachClient, SubmitOptions, TaskFailed
from broker.models import TaskStatus
from reach_cli.common import (
    EXIT_RUNTIME,
    EXIT_USAGE,
    ConfigOption,
    JsonOption,
    RedisUrlOption,
    cli_errors,
    console,
    fail,
    load_settings,
    print_json,
)


def _parse_json(text: str, what: str) -> Any:
    try:
        return json.loads(text, parse_constant=_refuse)
    except ValueError as exc:
        fail(f"{what} is not valid JSON: {exc}", EXIT_USAGE)


def _refuse(name: str) -> Any:
    raise ValueError(f"{name} is not strict JSON")


def _show_status(status: TaskStatus, as_json: bool) -> None:
    if as_json:
        print_json(status.cli_dict())
        return
    for key, value in status.cli_dict().items():
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
    trace_id: Annotated[str | None, typer.Option()] = None,
    metadata: Annotated[str | None, typer.Option(help="JSON object")] = None,
    as_json: JsonOption = False,
    redis_url: RedisUrlOption = None,
    config: ConfigOption = None,
) -> None:
    """Submit a task; print its id (or, with --wait, its result)."""
    body = _parse_json(payload, "payload")
    meta = _parse_json(metadata, "--metadata") if metadata is not None else None
    with ReachClient(load_settings(config, redis_url)) as client:
        handle = client.submit(capability, body, SubmitOptions(
            priority=priority, session_id=session_id, region=region,
            idempotency_key=idempotency_key, timeout_s=timeout_s, deadline_s=deadline_s,
            trace_id=trace_id, metadata=meta,
        ))
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


@cli_errors
def cancel(
    task_id: Annotated[str, typer.Argument()],
    as_json: JsonOption = False,
    redis_url: RedisUrlOption = None,
    config: ConfigOption = None,
) -> None:
    """Cancel a task wherever it is (queued, waiting for a retry, or running)."""
    with ReachClient(load_settings(config, redis_url)) as client:
        canceled = client.cancel(task_id)
        state = client.status(task_id).state.value
    if as_json:
        print_json({"task_id": task_id, "canceled": canceled, "state": state})
    elif canceled:
        typer.echo(f"{task_id} canceled")
    else:
        typer.echo(f"{task_id} had already ended ({state}); nothing to cancel")
