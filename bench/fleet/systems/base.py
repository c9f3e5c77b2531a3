"""What the runner needs of a system: start an agent, its helpers and its producer; stop them.

Every process goes through the run's Supervisor (bench/procs.py), so every one dies with the
run. Agents are started piped when they speak the READY line protocol (the peers' launchers and
the producers do); Reach's agents are plain `reach-worker` processes, ready once healthy.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from bench.procs import Proc, Supervisor, stop_all
from bench.rows.base import ready_all


@dataclass
class RunContext:
    """One system in one scenario: its fresh Redis, its folder, the supervisor."""

    url: str
    prefix: str
    run_dir: Path
    sup: Supervisor
    env: Callable[..., dict[str, str]]
    python: Callable[..., list[str]]
    concurrency: int
    log: Callable[[str], None]
    reach_env: dict[str, str]
    """Extra REACH_* settings for Reach's processes (empty: its defaults)."""


class System(ABC):
    key: ClassVar[str]
    title: ClassVar[str]
    tuned: ClassVar[bool] = False
    """Whether this system takes the run's --reach-env settings (the labelled Reach variant)."""
    stop_command: ClassVar[str | None] = "STOP"
    """The stdin line that stops an agent (None: SIGTERM)."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx

    def unavailable(self) -> str | None:
        """Why this system cannot run here (skipped with that note), or None."""
        return None

    def install(self) -> None:  # noqa: B027 - optional hook
        """Once per benchmark, before any run (npm install); an error skips the system."""

    def prepare(self) -> None:  # noqa: B027 - optional hook
        """Once per run, on its fresh Redis (Reach loads its scripts)."""

    @abstractmethod
    def settings(self) -> dict[str, Any]:
        """How the system is configured, for the JSON and the README."""

    @abstractmethod
    def start_agent(self, name: str, env: dict[str, str]) -> Proc:
        """Start one agent process (not waiting for it)."""

    def wait_ready(self, agents: dict[str, Proc]) -> None:
        ready_all(list(agents.values()), timeout=60)

    def start_helpers(self) -> list[Proc]:
        """Processes besides agents and producer (Reach's dispatcher), started once agents are ready."""
        return []

    @abstractmethod
    def start_producer(self, plan: Path, out: Path, deadline_s: float) -> Proc:
        """Start the producer (piped; it prints READY, then waits for GO)."""

    def refused(self, tasks: dict[int, str]) -> dict[int, int]:
        """For tasks (index -> system id) that more than one execution finished with success:
        how many of those results the system refused (a fenced late result)."""
        return {}

    def stop(self, agents: list[Proc], helpers: list[Proc]) -> None:
        stop_all(helpers, 5.0)
        stop_all(agents, 5.0, command=self.stop_command)
