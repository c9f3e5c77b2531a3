"""How `reach dlq` shows things to a person (rich tables and text). `--json` bypasses all of it."""

from __future__ import annotations

import json

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from dlq_tools.history import Attempt
from dlq_tools.models import DeadLetter, DeadLetterDetail, Report
from dlq_tools.parsing import human_age, iso_ms, one_line
from dlq_tools.stats import Stats

PAYLOAD_PREVIEW_CHARS = 2000
REPORT_ITEMS_SHOWN = 50


def letters_table(console: Console, items: list[DeadLetter], now_ms: int) -> None:
    table = Table(show_edge=False, pad_edge=False, header_style="bold")
    for name in ("id", "capability", "reason", "attempts", "last error", "age", "last agent"):
        table.add_column(name, no_wrap=name in ("id", "age"),
                         justify="right" if name in ("attempts", "age") else "left")
    for d in items:
        table.add_row(escape(d.ref), escape(d.capability), d.reason, str(d.attempts),
                      escape(one_line(d.error, 60)), human_age(now_ms - d.dead_at_ms),
                      escape(d.last_agent_id or "-"))
    console.print(table)


def detail(console: Console, d: DeadLetterDetail, now_ms: int, full: bool) -> None:
    letter = d.letter
    rows = [
        ("task id", letter.task_id or "(none: a malformed entry)"),
        ("entry", letter.entry),
        ("capability", letter.capability),
        ("reason", letter.reason),
        ("error", letter.error or ""),
        ("attempts", str(letter.attempts)),
        ("last agent", letter.last_agent_id or "-"),
        ("dead at", f"{iso_ms(letter.dead_at_ms)} ({human_age(now_ms - letter.dead_at_ms)} ago)"),
        ("trace id", d.record.get("trace_id") or "-"),
    ]
    if letter.source:
        rows.append(("source", letter.source))
    if letter.imported_from:
        rows.append(("imported from", letter.imported_from))
    for key, value in d.envelope().items():
        if value not in (None, "", 0) or key == "priority":
            rows.append((key.replace("_", " "), value if isinstance(value, str) else json.dumps(value)))
    for key, value in rows:
        console.print(f"[bold]{key:>14}[/bold]  {escape(str(value))}")
    console.print("[bold]payload[/bold]" if d.payload_text is not None else "[bold]raw fields[/bold]")
    body = d.payload() if d.payload_text is not None else d.raw
    text = json.dumps(body, indent=2, ensure_ascii=False)
    if not full and len(text) > PAYLOAD_PREVIEW_CHARS:
        hidden = len(text) - PAYLOAD_PREVIEW_CHARS
        text = text[:PAYLOAD_PREVIEW_CHARS] + f"\n… ({hidden} more characters; --full shows all)"
    console.print(escape(text), soft_wrap=True)
    attempts_table(console, d.attempt_history)


def attempts_table(console: Console, attempts: list[Attempt]) -> None:
    if not attempts:
        console.print("[bold]attempts[/bold]  none (the task never started)")
        return
    table = Table(title="attempts", title_justify="left", show_edge=False, header_style="bold")
    for name in ("replay", "attempt", "agent", "started", "ended", "outcome", "error"):
        table.add_column(name)
    for a in attempts:
        table.add_row(str(a.replay), str(a.attempt), escape(a.agent_id or "-"),
                      iso_ms(a.started_at_ms) or "-", iso_ms(a.ended_at_ms) or "-", a.outcome,
                      escape(one_line(a.error, 60)))
    console.print(table)


def stats(console: Console, s: Stats) -> None:
    if not s.capabilities:
        console.print("The DLQ is empty.")
        return
    reasons = sorted(s.by_reason)
    table = Table(show_edge=False, header_style="bold")
    table.add_column("capability")
    for r in reasons:
        table.add_column(r, justify="right")
    table.add_column("total", justify="right")
    table.add_column("oldest")
    table.add_column("newest")
    for c in s.capabilities:
        table.add_row(escape(c.capability), *(str(c.by_reason.get(r, 0)) for r in reasons),
                      str(c.total), iso_ms(c.oldest_ms) or "-", iso_ms(c.newest_ms) or "-")
    table.add_row("[bold]all[/bold]", *(str(s.by_reason.get(r, 0)) for r in reasons), str(s.total),
                  iso_ms(s.oldest_ms) or "-", iso_ms(s.newest_ms) or "-")
    console.print(table)
    if s.top_errors:
        errors = Table(title="top errors", title_justify="left", show_edge=False, header_style="bold")
        errors.add_column("count", justify="right")
        errors.add_column("error")
        errors.add_column("capabilities")
        for e in s.top_errors:
            errors.add_row(str(e.count), escape(one_line(e.error, 80) or "(no message)"),
                           escape(", ".join(e.capabilities)))
        console.print(errors)


_VERBS = {"replayed": "replayed", "would_replay": "would be replayed", "purged": "purged",
          "would_purge": "would be purged", "gone": "already gone from the DLQ",
          "malformed": "skipped (malformed: no task to replay)", "active": "left alone (task active)",
          "full": "left in the DLQ (queue full)", "mismatch": "skipped (entry holds another task)"}


def report(console: Console, r: Report) -> None:
    if r.dry_run or len(r.outcomes) <= REPORT_ITEMS_SHOWN:
        for o in r.outcomes[:REPORT_ITEMS_SHOWN]:
            console.print(f"{escape(o.target.ref)}: {_VERBS.get(o.status, o.status)}"
                          + (f" — {escape(o.detail)}" if o.detail else ""))
        if len(r.outcomes) > REPORT_ITEMS_SHOWN:
            console.print(f"… and {len(r.outcomes) - REPORT_ITEMS_SHOWN} more")
    head = "dry run, nothing changed: " if r.dry_run else ""
    parts = [f"{n} {_VERBS.get(status, status)}" for status, n in sorted(r.counts().items())]
    console.print(f"{head}{r.selected} selected; " + ("; ".join(parts) if parts else "nothing done"))
    if r.stopped:
        left = r.selected - len(r.outcomes)
        console.print(f"stopped: {escape(r.stopped)}; {left} not attempted, still in the DLQ")
