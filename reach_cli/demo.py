"""`reach demo`: start the stack, push real documents through it, show what happened, exit."""

import time
from pathlib import Path

from rich.live import Live
from rich.table import Table

from broker import ReachClient, TaskFailed
from broker.models import TaskStatus
from broker.settings import Settings
from reach_cli.common import console
from reach_cli.samples import DOCUMENTS
from reach_cli.stack import Stack

DEMO_TIMEOUT_S = 90.0
_STATE_STYLE = {"succeeded": "green", "failed": "red", "canceled": "yellow", "running": "cyan"}


def _progress_table(rows: list[tuple[str, int, TaskStatus]]) -> Table:
    table = Table(title="Tasks", expand=False)
    for column in ("document", "priority", "state", "attempt", "agent"):
        table.add_column(column)
    for title, priority, status in rows:
        style = _STATE_STYLE.get(status.state.value, "")
        table.add_row(title, str(priority), f"[{style}]{status.state.value}[/{style}]" if style
                      else status.state.value, str(status.attempt), status.agent_id or "-")
    return table


def run_demo(settings: Settings, config: Path | None) -> int:
    stack = Stack(settings, quiet=True, config=config, metrics=False)
    console.print("[bold]Agent-Reach demo[/bold]: starting Redis, a dispatcher and two "
                  "summarize agents…")
    try:
        stack.start()
        stack.wait_ready()
        settings = Settings.load(config, redis_url=stack.url, prefix=settings.prefix)
        console.print(f"stack is up on {settings.redacted_url()} (prefix {settings.prefix!r}); "
                      f"submitting {len(DOCUMENTS) + 1} tasks with mixed priorities")
        with ReachClient(settings) as client:
            jobs = []
            for i, (title, text) in enumerate(DOCUMENTS):
                priority = (i * 7) % 10
                jobs.append((title, priority, client.submit(
                    "summarize", {"text": text, "max_sentences": 2}, priority=priority)))
            # One bad request, to show that failures are visible, classified and never retried.
            jobs.append(("(empty text)", 5, client.submit("summarize", {"text": "   "})))
            deadline = time.monotonic() + DEMO_TIMEOUT_S
            with Live(console=console, refresh_per_second=8) as live:
                while True:
                    rows = [(title, pri, h.status()) for title, pri, h in jobs]
                    live.update(_progress_table(rows))
                    if all(s.state.terminal for _, _, s in rows):
                        break
                    if time.monotonic() > deadline:
                        console.print("[red]demo timed out waiting for tasks[/red]")
                        return 1
                    time.sleep(0.15)
            results = Table(title="Results")
            for column in ("priority", "document", "outcome", "agent", "summary"):
                results.add_column(column, overflow="fold")
            ok = True
            for title, priority, handle in jobs:
                status = handle.status()
                try:
                    summary = handle.result(timeout=5)["summary"]
                    outcome = "[green]succeeded[/green]"
                except TaskFailed as exc:
                    summary = exc.error or ""
                    outcome = f"[red]failed: {exc.reason}[/red]"
                    ok = ok and title == "(empty text)" and exc.reason == "invalid_request"
                results.add_row(str(priority), title, outcome, status.agent_id or "-", summary)
            console.print(results)
        if stack.dead():
            console.print(f"[red]{', '.join(stack.dead())} died (logs in {stack.log_dir})[/red]")
            return 1
        console.print("[green]demo finished[/green]: every task either succeeded or failed "
                      "visibly; the empty one failed as invalid_request, was not retried, and "
                      "went to the dead-letter stream.")
        return 0 if ok else 1
    finally:
        stack.stop()
