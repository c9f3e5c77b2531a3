"""Where and how a run was made: the machine and the commit (both benchmarks), and a fleet run's
whole provenance for its JSON."""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.procs import ROOT


def machine() -> dict[str, Any]:
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_gib = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
    load = None
    with contextlib.suppress(OSError):
        load = os.getloadavg()
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": mem_gib,
            "kernel": platform.release(), "python": platform.python_version(),
            "load_average_at_start": load}


def git_state() -> dict[str, Any]:
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    dirty = git("status", "--porcelain", "--", "broker", "dispatcher", "agent_worker", "reach_cli")
    return {"commit": git("rev-parse", "HEAD") or None, "reach_code_dirty": bool(dirty)}


def meta(args: argparse.Namespace, argv: list[str], started: float) -> dict[str, Any]:
    versions: dict[str, str | None] = {}
    for dist in ("agent-reach", "redis", "celery", "kombu", "dramatiq", "matplotlib"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    git = git_state()
    host = machine()
    return {"command": " ".join(["python -m bench fleet", *argv]),
            "mode": "smoke" if args.smoke else "full",
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(started)),
            "started_epoch": started, "commit": git["commit"], "reach_code_dirty": git["reach_code_dirty"],
            "cpu": host["cpu"], "machine": host, "versions": versions}
