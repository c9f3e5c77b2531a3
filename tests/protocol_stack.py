"""What the agent-protocol tests share: a real stack (dispatcher, workers, gateways as processes)
and small readers of what the SDKs answer."""

from __future__ import annotations

import secrets
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from broker.settings import Settings
from tests.conftest import FAST, Fleet, _delete_prefix, sync_redis
from tests.gateway_helpers import start_gateway

LONG = "longjob"
ECHO = "echo"
HANDLER = "tests.protocol_handlers:long_job"


class Stack:
    def __init__(self, settings: Settings, fleet: Fleet, urls: list[str]) -> None:
        self.settings = settings
        self.fleet = fleet
        self.urls = urls

    @property
    def url(self) -> str:
        return self.urls[0]

    def task_records(self, capability: str) -> int:
        """How many task records the capability has (a refused request must add none)."""
        client = sync_redis(self.settings.redis_url)
        try:
            pattern = f"{self.settings.prefix}:{{{capability}}}:task:*"
            return sum(1 for key in client.scan_iter(pattern, count=1000) if key.count(":") == 3)
        finally:
            client.close()


@contextmanager
def protocol_stack(redis_url: str, tmp: Path, gateways: int = 1, **overrides: Any) -> Iterator[Stack]:
    """A dispatcher, a worker serving `longjob`, `echo` and `summarize`, and `gateways` gateways."""
    prefix = f"t{secrets.token_hex(4)}"
    settings = Settings.load(redis_url=redis_url, prefix=prefix, **{**FAST, **overrides})
    fleet = Fleet(settings, tmp)
    try:
        fleet.dispatcher()
        fleet.worker(f"{LONG}={HANDLER}", ECHO, "summarize", concurrency=8,
                     extra_args=["--describe", "echo=Answers its payload unchanged"])
        urls = [start_gateway(fleet)[1] for _ in range(gateways)]
        yield Stack(settings, fleet, urls)
    except BaseException:
        for proc in fleet.procs:
            sys.stderr.write(f"\n----- {proc.name} -----\n{proc.output()[-3000:]}\n")
        raise
    finally:
        fleet.stop_all()
        _delete_prefix(redis_url, prefix)
