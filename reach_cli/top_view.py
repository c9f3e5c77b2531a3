"""What `reach top` shows, computed from reads (pure): rows of the capability and agent tables
and lines of the event feed, and the rates it measures from the feed over a sliding window."""

import time
from collections import deque
from dataclasses import dataclass

from rich.text import Text

from broker.ops.feed import FeedEvent

RATE_WINDOW_S = 10.0
STATE_STYLE = {"healthy": "green", "warming": "cyan", "suspect": "yellow", "offline": "red",
               "draining": "magenta", "not_ready": "dark_orange"}
EVENT_STYLE = {"queued": "cyan", "dispatched": "blue", "accepted": "green", "progress": "yellow",
               "succeeded": "bold green", "failed": "bold red", "dead_lettered": "red",
               "retry_scheduled": "magenta", "reclaimed": "yellow", "canceled": "dim", "expired": "red",
               "scheduled": "magenta", "replayed": "magenta"}


@dataclass
class Rates:
    """Events per second per capability over the last RATE_WINDOW_S, counted by the events'
    own times (so the recent past a view starts with counts only for what is in the window)."""

    window_s: float = RATE_WINDOW_S

    def __post_init__(self) -> None:
        self._seen: deque[tuple[int, str, str]] = deque()

    def add(self, events: list[FeedEvent]) -> None:
        for event in events:
            if not event.is_agent_event and event.type in ("queued", "succeeded", "failed"):
                self._seen.append((event.time_ms, event.capability, event.type))

    def per_second(self, capability: str, kind: str, now_ms: int | None = None) -> float:
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        low = now_ms - self.window_s * 1000
        while self._seen and self._seen[0][0] < low:
            self._seen.popleft()
        return sum(1 for t, c, k in self._seen if t >= low and c == capability and k == kind) / self.window_s


def state_text(state: str) -> Text:
    return Text(state, style=STATE_STYLE.get(state, ""))


def feed_line(event: FeedEvent) -> Text:
    """One line of the feed: time, event, task (or agent), detail."""
    clock = time.strftime("%H:%M:%S", time.localtime(event.time_ms / 1000)) + f".{event.time_ms % 1000:03d}"
    line = Text(f"{clock} ", style="dim")
    if event.is_agent_event:
        line.append(f"{event.type:<15}", style="bold blue")
        line.append(f"{event.agent_id} ")
        line.append(event.detail, style="dim")
        return line
    line.append(f"{event.type:<15}", style=EVENT_STYLE.get(event.type, ""))
    line.append(event.task_id)
    if event.agent_id:
        line.append(f"  on {event.agent_id}", style="dim")
    if event.attempt > 1:
        line.append(f"  attempt {event.attempt}", style="yellow")
    return line


def rate(value: float) -> str:
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"
