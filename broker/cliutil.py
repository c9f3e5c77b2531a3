"""What every command-line entry point shares: logging, and turning errors into exit codes.

Errors are one line on stderr. Exit codes: 0 ok, 1 runtime failure, 2 usage (bad flag, bad
JSON, bad input).
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import typer

from broker.errors import BadInput, ReachError

F = TypeVar("F", bound=Callable[..., Any])

EXIT_RUNTIME = 1
EXIT_USAGE = 2


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


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

    return wrapper  # type: ignore[return-value]
