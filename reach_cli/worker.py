"""`reach-worker`: serve one or more capabilities from this process (the worker itself is
agent_worker.Worker)."""

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from agent_worker.handlers import resolve_bindings
from agent_worker.http_bridge.options import BridgeOptions
from agent_worker.worker import Worker
from broker.infra import eventloop
from broker.settings import Settings
from reach_cli.common import (
    EXIT_USAGE,
    LogFormatOption,
    MetricsAddrOption,
    cli_errors,
    fail,
    run_app,
    setup_logging,
)

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


def parse_labels(items: list[str]) -> dict[str, str]:
    labels = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail(f"--label {item!r}: expected key=value", EXIT_USAGE)
        labels[key] = value
    return labels


@app.command()
@cli_errors
def serve(
    capability: Annotated[list[str] | None, typer.Option(
        "--capability", "-c",
        help="Capability to serve; repeat for several. 'name=pkg.mod:func' binds a handler to one.")] = None,
    handler: Annotated[str | None, typer.Option(help="pkg.mod:func serving every --capability")] = None,
    http: Annotated[str | None, typer.Option(help="URL of an HTTP agent serving every --capability")] = None,
    http_header: Annotated[list[str] | None, typer.Option(
        help="'Name: value' sent to the HTTP agent (${VAR}: an environment variable); repeatable")] = None,
    http_ready: Annotated[str | None, typer.Option(
        help="The HTTP agent's readiness URL (GET, 2xx), or 'auto' for <origin>/ready")] = None,
    http_callback_url: Annotated[str | None, typer.Option(
        envvar="REACH_GATEWAY_URL",
        help="The gateway's URL, where HTTP agents that answer 202 post the outcome")] = None,
    http_poll_after: Annotated[float, typer.Option(
        min=0, help="Seconds an accepted task's callback is awaited before its status_url is polled")] = 5.0,
    a2a: Annotated[str | None, typer.Option(
        help="Base URL of an A2A agent: its card's skills become capabilities (or it serves "
             "--capability)")] = None,
    skill: Annotated[str | None, typer.Option(
        help="With --a2a and one --capability: the card's skill that serves it (default: its name)")] = None,
    a2a_header: Annotated[list[str] | None, typer.Option(
        help="'Name: value' sent to the A2A agent (${VAR}: an environment variable); repeatable")] = None,
    describe: Annotated[list[str] | None, typer.Option(
        help="[CAP=]TEXT or [CAP=]@FILE.json (description, input_schema, output_schema, examples): "
             "what a capability does, registered with the agent; repeatable")] = None,
    concurrency: Annotated[int, typer.Option(min=1, max=10000, help="Tasks run at once")] = 8,
    region: Annotated[str | None, typer.Option(help="Region/data locality label")] = None,
    version: Annotated[str | None, typer.Option(help="Agent version, for version routing")] = None,
    agent_id: Annotated[str | None, typer.Option(help="Default: hostname-pid-random")] = None,
    warmup_s: Annotated[float, typer.Option(min=0, help="Seconds to stay 'warming' after start")] = 0.0,
    label: Annotated[list[str] | None, typer.Option(help="key=value label; repeatable")] = None,
    redis_url: Annotated[str | None, typer.Option(help="Redis URL (else REDIS_URL)")] = None,
    config: Annotated[Path | None, typer.Option(help="Config file (else REACH_CONFIG, ./reach.toml)")] = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING, ERROR")] = "INFO",
    log_format: LogFormatOption = None,
    metrics_addr: MetricsAddrOption = None,
) -> None:
    """Serve capabilities: read tasks from this agent's inboxes, run them, report results."""
    settings = Settings.load(config, redis_url=redis_url, log_format=log_format, metrics_addr=metrics_addr)
    setup_logging(log_level, settings.log_format)
    if sum(1 for given in (handler, http, a2a) if given) > 1:
        fail("give one of --handler, --http and --a2a", EXIT_USAGE)
    if skill is not None and a2a is None:
        fail("--skill goes with --a2a", EXIT_USAGE)
    new_loop = eventloop.loop_factory()  # (a bad REACH_EVENT_LOOP fails before handlers load)
    bridge = BridgeOptions.build(http_header, http_ready, http_callback_url, http_poll_after)
    capabilities, a2a_agents = list(capability or []), None
    if a2a is not None:
        from agent_worker.a2a.startup import a2a_agents as read_agents

        capabilities, a2a_agents = read_agents(a2a, capabilities, skill, a2a_header)
    bindings = resolve_bindings(settings, capabilities, handler=handler, http=http, http_options=bridge,
                                a2a=a2a_agents, describes=describe)
    worker = Worker(settings, bindings, concurrency=concurrency, agent_id=agent_id, region=region,
                    version=version, warmup_s=warmup_s, labels=parse_labels(label or []))
    raise typer.Exit(_run(worker, new_loop))


def _run(worker: Worker, new_loop: Callable[[], asyncio.AbstractEventLoop]) -> int:
    """Run the worker until it stops; its exit code."""
    loop = new_loop()
    code = loop.run_until_complete(worker.run())
    stuck = worker.still_running()
    if stuck:
        # (asyncio.run would wait for a task given up, and Python joins handler threads at
        # exit: a handler that never returns would keep this process from ever ending. Its
        # task was reported and runs elsewhere.)
        logging.getLogger("reach.worker").warning(
            "%d handler(s) given up are still running; exiting without them", stuck)
        logging.shutdown()
        os._exit(code)
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()
    return code


def main() -> None:
    run_app(app)


if __name__ == "__main__":
    main()
