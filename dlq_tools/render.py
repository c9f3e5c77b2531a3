"""How `reach dlq` shows things to a person (rich tables and text). `--json` bypasses all of it."""

from __future__ import annotations

import json

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from broker.protocol.trace import trace_id_of
from dlq_tools.history import Attempt
from dlq_tools.models import DeadLetter, DeadLetterDetail, Report
from dlq_tools.parsing import human_age, iso_ms, one_line, short_time
from dlq_tools.stats import Stats

PAYLOAD_PREVIEW_CHARS = 2000
REPORT_ITEMS_SHOWN = 50


def _table(console: Console, headers: list[str], rows: list[list[str]], right: set[str],
           title: str | None = None, cut_last: bool = True) -> None:
    """A table whose last column (a message) is cut to the room left (`cut_last`); the other
    columns (ids, which people copy) are never cut: on a console too narrow for them the table
    is printed wider than the console rather than mangled."""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    fixed = sum(widths[:-1]) + 3 * (len(widths) - 1) + 1
    room = max(20, console.width - fixed) if cut_last else widths[-1]
    table = Table(show_edge=False, pad_edge=False, header_style="bold", title=title,
                  title_justify="left")
    for h in headers:
        table.add_column(h, no_wrap=True, justify="right" if h in right else "left")
    for row in rows:
        table.add_row(*(escape(c) for c in row[:-1]), escape(one_line(row[-1], room)))
    width = fixed + room
    if width <= console.width:
        console.print(table)
    else:
        Console(file=console.file, width=width, force_terminal=console.is_terminal,
                no_color=console.no_color, highlight=False).print(table)


def letters_table(console: Console, items: list[DeadLetter], now_ms: int) -> None:
    # The id starts with the capability: on a narrow console the capability column goes first.
    wide = console.width >= 120
    rows = [[d.ref, *([d.capability] if wide else []), d.reason, str(d.attempts),
             human_age(now_ms - d.dead_at_ms), d.last_agent_id or "-", d.error or ""] for d in items]
    headers = ["id", *(["capability"] if wide else []), "reason", "attempts", "age", "last agent",
               "last error"]
    _table(console, headers, rows, {"attempts", "age"})


def detail(console: Console, d: DeadLetterDetail, now_ms: int, full: bool) -> None:
    letter = d.letter
    rows = [
        ("task id", letter.task_id or "(none: a malformed entry)"),
        ("entry", letter.entry),
        ("capability", letter.capability),
        ("reason", letter.reason),
        ("attempts", str(letter.attempts)),
        ("last agent", letter.last_agent_id or "-"),
        ("dead at", f"{iso_ms(letter.dead_at_ms)} ({human_age(now_ms - letter.dead_at_ms)} ago)"),
        ("trace id", trace_id_of(d.record.get("trace")) or "-"),
    ]
    if letter.source:
        rows.append(("source", letter.source))
    if letter.imported_from:
        rows.append(("imported from", letter.imported_from))
    for key, value in d.envelope().items():
        if value not in (None, "", 0) or (key == "priority" and value is not None):
            rows.append((key.replace("_", " "), value if isinstance(value, str) else json.dumps(value)))
    error_lines = (letter.error or "-").splitlines() or ["-"]
    rows.insert(4, ("error", error_lines[0]))
    for key, value in rows:
        console.print(f"[bold]{key:>14}[/bold]  {escape(str(value))}", soft_wrap=True)
        if key == "error":
            for line in error_lines[1:]:
                console.print(" " * 16 + escape(line), soft_wrap=True)
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
    rows = []
    for a in attempts:
        took = "-"
        begun = a.started_at_ms or a.dispatched_at_ms
        if a.ended_at_ms and begun:
            took = f"{(a.ended_at_ms - begun) / 1000:.1f}s"
        rows.append([str(a.replay), str(a.attempt), a.agent_id or "-",
                     short_time(a.started_at_ms or a.ended_at_ms), took, a.outcome, a.error or ""])
    _table(console, ["replay", "#", "agent", "started (UTC)", "took", "outcome", "error"], rows,
           {"replay", "#", "took"}, title="attempts")


def stats(console: Console, s: Stats) -> None:
    if not s.capabilities:
        console.print("The DLQ is empty.")
        return
    rows = []
    for c in s.capabilities:
        rows.append([c.capability, "(all)", str(c.total), short_time(c.oldest_ms), short_time(c.newest_ms)])
        rows += [["", reason, str(n), "", ""] for reason, n in sorted(c.by_reason.items())]
    if len(s.capabilities) > 1:
        rows.append(["(all)", "(all)", str(s.total), short_time(s.oldest_ms), short_time(s.newest_ms)])
    _table(console, ["capability", "reason", "count", "oldest (UTC)", "newest (UTC)"], rows, {"count"},
           cut_last=False)
    if s.top_errors:
        rows = [[str(e.count), ", ".join(e.capabilities), e.error or "(no message)"] for e in s.top_errors]
        _table(console, ["count", "capabilities", "error"], rows, {"count"}, title="top errors")


_VERBS = {"replayed": "replayed", "would_replay": "would be replayed", "purged": "purged",
          "would_purge": "would be purged", "gone": "already gone from the DLQ",
          "malformed": "skipped (malformed)", "active": "left alone (task active)",
          "full": "left in the DLQ (queue full)", "mismatch": "skipped (entry holds another task)",
          "corrupt": "left in the DLQ (record unusable)"}


def report(console: Console, r: Report) -> None:
    if r.dry_run or len(r.outcomes) <= REPORT_ITEMS_SHOWN:
        for o in r.outcomes[:REPORT_ITEMS_SHOWN]:
            console.print(f"{escape(o.target.ref)}: {_VERBS.get(o.status, o.status)}"
                          + (f" — {escape(o.detail)}" if o.detail else ""), soft_wrap=True)
        if len(r.outcomes) > REPORT_ITEMS_SHOWN:
            console.print(f"… and {len(r.outcomes) - REPORT_ITEMS_SHOWN} more")
    head = "dry run, nothing changed: " if r.dry_run else ""
    parts = [f"{n} {_VERBS.get(status, status)}" for status, n in sorted(r.counts().items())]
    console.print(f"{head}{r.selected} selected; " + ("; ".join(parts) if parts else "nothing done"),
                  soft_wrap=True)
    if r.stopped:
        left = r.selected - len(r.outcomes)
        console.print(f"stopped: {escape(r.stopped)} ({left} of {r.selected} not reached)",
                      soft_wrap=True)
