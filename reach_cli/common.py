"""What every command line shares (`reach` and `reach-worker`): options, logging, output, and
turning errors into exit codes.

Errors are one line on stderr. Exit codes: 0 ok, 1 runtime failure, 2 usage (bad flag, bad
JSON, bad input).
"""

import functools
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar, cast

import redis
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from broker.acl import denied, is_permission_error
from broker.errors import BadInput, ReachError
from broker.infra import connection, logs, outages
from broker.settings import Settings

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

EXIT_RUNTIME = 1
EXIT_USAGE = 2

RedisUrlOption = Annotated[str | None, typer.Option("--redis-url", help="Redis URL (else REDIS_URL)")]
ConfigOption = Annotated[
    Path | None, typer.Option("--config", help="Config file (else REACH_CONFIG, ./reach.toml)")
]
JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable JSON output")]

console = Console()
err_console = Console(stderr=True)


def load_settings(config: Path | None, redis_url: str | None, **overrides: Any) -> Settings:
    return Settings.load(config, redis_url=redis_url, **overrides)


def read_redis(settings: Settings, read: Callable[[connection.SyncRedis], T]) -> T:
    """`read` on a short-lived client; BrokerUnavailable when Redis cannot be reached."""
    client = connection.sync_client(settings)
    try:
        return read(client)
    except outages.TRANSIENT_ERRORS as exc:
        raise outages.unavailable(exc, settings) from exc
    finally:
        client.close()


def confirm(question: str, dry_run: bool, yes: bool) -> None:
    """Ask before a destructive step (unless dry_run or yes); exit when refused, or when
    there is no terminal to ask on (--yes is needed then)."""
    if dry_run or yes:
        return
    if not sys.stdin.isatty():
        fail(f"{question.rstrip('?')}: needs --yes (no terminal to confirm on)", EXIT_USAGE)
    if not typer.confirm(question, default=False, err=True):
        fail("aborted; nothing changed", EXIT_RUNTIME)


@contextmanager
def progress(total: int, label: str, show: bool) -> Iterator[Callable[..., None]]:
    """A progress bar on stderr for a long run of `total` steps (a call per step advances it);
    nothing when not shown, not on a terminal, or for fewer than two steps."""
    if not show or not err_console.is_terminal or total < 2:
        yield lambda *_: None
        return
    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=err_console, transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda *_: bar.advance(task)


def parse_json(text: str, what: str) -> Any:
    """Strict JSON an operator typed (NaN and Infinity refused); exit 2 naming `what` else."""
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except ValueError as exc:
        fail(f"{what} is not valid JSON: {exc}", EXIT_USAGE)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not strict JSON")


def print_json(value: Any) -> None:
    typer.echo(json.dumps(value, ensure_ascii=False, default=str))


LogFormatOption = Annotated[str | None, typer.Option(
    "--log-format", help="text (default) or json: one JSON object a line (else REACH_LOG_FORMAT)")]
MetricsAddrOption = Annotated[str | None, typer.Option(
    "--metrics-addr", help="HOST:PORT for /metrics, /healthz, /readyz (port 0: a free one); off: none")]


def setup_logging(level: str = "INFO", fmt: str = "text") -> None:
    logs.setup(level, "json" if fmt == "json" else "text")


def fail(message: str, code: int = EXIT_RUNTIME) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def run_app(app: typer.Typer) -> None:
    """Run a Typer app with usage errors as one line on stderr (exit 2), not a boxed panel."""
    try:  # typer >= 0.16 carries its own copy of click
        from typer._click.exceptions import ClickException  # type: ignore[import-not-found,unused-ignore]
    except ImportError:  # pragma: no cover - older typer uses click itself
        from click.exceptions import ClickException  # type: ignore[assignment,unused-ignore]
    try:
        code = app(standalone_mode=False)
    except ClickException as exc:
        message = exc.format_message()
        if message:  # (empty when the help was shown because no arguments were given)
            typer.echo(f"error: {message}", err=True)
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("aborted", err=True)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


def cli_errors(func: F) -> F:
    """Map library errors to one line on stderr and the documented exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except BadInput as exc:
            fail(str(exc), EXIT_USAGE)
        except ReachError as exc:
            fail(str(exc), EXIT_RUNTIME)
        except TimeoutError as exc:
            fail(str(exc), EXIT_RUNTIME)
        except redis.exceptions.RedisError as exc:
            if not is_permission_error(exc):
                raise
            fail(str(denied(exc)), EXIT_RUNTIME)

    return cast(F, wrapper)
