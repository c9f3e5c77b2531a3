"""`reach`: run the stack, submit and inspect tasks, watch agents and queues, work the DLQ."""

import asyncio
import signal
import time
from typing import Annotated

import typer

from broker.infra import eventloop
from broker.settings import redact_url
from gateway.addresses import DEFAULT_ADDR
from reach_cli import acl, agents, gateway, ops, policy, schedules, search, tasks, top
from reach_cli.common import (
    EXIT_RUNTIME,
    ConfigOption,
    LogFormatOption,
    MetricsAddrOption,
    RedisUrlOption,
    cli_errors,
    console,
    fail,
    load_settings,
    run_app,
    setup_logging,
)
from reach_cli.dlq import app as dlq_app

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Agent-Reach: every agent reachable by capability name.")

app.command()(tasks.submit)
app.command()(tasks.status)
app.command()(tasks.result)
app.command()(tasks.cancel)
app.command()(search.tasks)
app.command()(ops.queues)
app.command()(ops.explain)
app.command()(ops.capabilities)
app.command()(top.top)
app.command()(gateway.serve)
app.command()(gateway.mcp)
app.command()(policy.pause)
app.command()(policy.resume)
app.add_typer(agents.app, name="agents")
app.command()(acl.acl)
app.add_typer(dlq_app, name="dlq")
app.add_typer(policy.app, name="policy")
app.add_typer(schedules.app, name="schedule")
app.add_typer(gateway.keys_app, name="keys")


@app.command()
@cli_errors
def up(
    workers: Annotated[int, typer.Option(min=0, help="How many summarize workers")] = 2,
    concurrency: Annotated[int, typer.Option(min=1, help="Concurrency of each worker")] = 4,
    prefix: Annotated[str | None, typer.Option(help="Key prefix")] = None,
    gateway_addr: Annotated[str, typer.Option(
        help="Where the HTTP gateway listens (port 0: a free one); 'none' for no gateway")] = DEFAULT_ADDR,
    redis_url: RedisUrlOption = None,
    config: ConfigOption = None,
) -> None:
    """Run the whole stack (embedded Redis unless REDIS_URL is set) until Ctrl-C."""
    from reach_cli.stack import Stack

    settings = load_settings(config, redis_url, prefix=prefix)
    stack = Stack(settings, workers=workers, concurrency=concurrency, config=config,
                  gateway_addr=None if gateway_addr == "none" else gateway_addr)
    stopping = False

    def request_stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    try:
        stack.start()
        stack.wait_ready()
        shown = redact_url(stack.url)  # (the user's own REDIS_URL may hold a password)
        console.print(f"[green]Agent-Reach is up[/green] on {shown} (prefix {settings.prefix!r}) "
                      f"with {workers} summarize worker(s). Try, in another shell:\n"
                      f"  REDIS_URL={shown} reach submit summarize "
                      "'{\"text\": \"One sentence. Another one.\"}' --wait", highlight=False)
        if stack.gateway_url:
            url = stack.gateway_url
            console.print(f"The HTTP gateway is up on {url} (API docs: {url}/docs):\n"
                          f"  curl -s {url}/v1/tasks -H 'Content-Type: application/json' "
                          "-d '{\"capability\": \"summarize\", \"payload\": {\"text\": \"One. Two.\"}}'",
                          highlight=False, soft_wrap=True)
            console.print(f"The operator console: {url}/console  (and in the terminal: reach top)",
                          highlight=False, soft_wrap=True)
        console.print("Ctrl-C stops everything.")
        while not stopping:
            if stack.dead():
                fail(f"{', '.join(stack.dead())} exited unexpectedly; stopping", EXIT_RUNTIME)
            time.sleep(0.2)
        console.print("stopping…")
    finally:
        stack.stop()


@app.command()
@cli_errors
def demo(
    prefix: Annotated[str, typer.Option(help="Key prefix for the demo's keys")] = "reach-demo",
    redis_url: RedisUrlOption = None,
    config: ConfigOption = None,
) -> None:
    """Start the stack, push sample documents through it, show results, stop, exit 0."""
    from reach_cli.demo import run_demo

    raise typer.Exit(run_demo(load_settings(config, redis_url, prefix=prefix), config))


@app.command()
@cli_errors
def dispatcher(
    capability: Annotated[list[str] | None, typer.Option(
        "--capability", "-c", help="Serve only these capabilities (default: all)")] = None,
    log_level: Annotated[str, typer.Option()] = "INFO",
    log_format: LogFormatOption = None,
    metrics_addr: MetricsAddrOption = None,
    redis_url: RedisUrlOption = None,
    config: ConfigOption = None,
) -> None:
    """Run a dispatcher (several may run at once). It serves /metrics, /healthz and /readyz on
    127.0.0.1:9464 unless told otherwise."""
    from broker.ids import check_capability
    from dispatcher import Dispatcher

    for name in capability or ():
        check_capability(name)  # (a name no task can have would be served silently, never used)
    settings = load_settings(config, redis_url, log_format=log_format, metrics_addr=metrics_addr)
    setup_logging(log_level, settings.log_format)
    with asyncio.Runner(loop_factory=eventloop.loop_factory()) as runner:
        code = runner.run(Dispatcher(settings, capability).run())
    raise typer.Exit(code)


def main() -> None:
    run_app(app)


if __name__ == "__main__":
    main()
