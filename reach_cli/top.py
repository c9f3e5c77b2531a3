"""`reach top`: the fleet live in the terminal (reach_cli/top_app.py)."""

from typing import Annotated

import typer

from broker.ids import check_capability
from reach_cli.common import ConfigOption, RedisUrlOption, cli_errors, load_settings


@cli_errors
def top(
    capability: Annotated[str | None, typer.Option("--capability", "-c",
                                                   help="Only this capability (key f changes it)")] = None,
    refresh: Annotated[float, typer.Option(min=0.2, max=60, help="Seconds between reads")] = 1.0,
    redis_url: RedisUrlOption = None,
    config: ConfigOption = None,
) -> None:
    """Watch capabilities, agents and task events live (f: filter, p: pause the feed, q: quit)."""
    from reach_cli.top_app import TopApp  # (Textual loads only for this command)

    if capability:
        check_capability(capability)
    settings = load_settings(config, redis_url)
    TopApp(settings, capability, refresh).run()
