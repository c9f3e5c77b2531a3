"""Walking a dead-letter stream page by page, filtered on the server (dlq_scan.lua).

Each script call examines at most SCAN_BUDGET entries (a few milliseconds of Redis time for
entries of 2 KB) and returns only the matches, so Redis is never blocked for long and only what
is asked for crosses the wire. Stream entry ids are the
server's time of dead-lettering, so a `since` bound also narrows the range itself (with a margin:
the id and the `dead_at` field are read a moment apart, and imported entries are newer than their
`dead_at`); the exact test on `dead_at` happens in the script.
"""

from __future__ import annotations

from collections.abc import Iterator

from dlq_tools.calls import Mode, parse_scan, scan_call
from dlq_tools.conn import Conn
from dlq_tools.models import Filter
from dlq_tools.parsing import entry_key

SCAN_BUDGET = 500
PAGE = 500
ID_MARGIN_MS = 60_000


def scan(
    conn: Conn, capability: str, f: Filter, *, newest_first: bool, mode: Mode,
    after: str | None = None, inclusive: bool = False, limit: int | None = None, task_id: str = "",
) -> Iterator[tuple[str, dict[str, str]]]:
    """Matching entries of one capability's stream as (entry id, fields), in stream order.

    `after` continues past an entry id (in the walking direction); `inclusive` includes it.
    """
    low = f"{max(0, f.since_ms - ID_MARGIN_MS)}-0" if f.since_ms else "-"
    if after is not None:
        near = after if inclusive else f"({after}"
        if not newest_first and low != "-" and entry_key(after) < entry_key(low):
            near = low
    else:
        near = "+" if newest_first else low
    far = low if newest_first else "+"
    left = limit
    while left is None or left > 0:
        want = PAGE if left is None else min(left, PAGE)
        call = scan_call(conn.settings, capability, f, newest_first=newest_first, start=near,
                         end=far, budget=SCAN_BUDGET, want=want, mode=mode, task_id=task_id)
        with conn.errors():
            page = parse_scan(conn.scripts(call))
        yield from page.matches
        if left is not None:
            left -= len(page.matches)
        if not page.cursor:
            return
        near = f"({page.cursor}"


def read_entry(conn: Conn, capability: str, entry_id: str) -> dict[str, str] | None:
    """One entry's fields, or None when the stream does not hold it."""
    with conn.errors():
        found = conn.redis.xrange(conn.keys(capability).dlq, entry_id, entry_id)
    return dict(found[0][1]) if found else None
