"""`reach top`: a live terminal view of capabilities (depths and rates), agents (states) and a
scrolling feed of task events (Textual). Keys: f filter by capability, p pause the feed,
q or Ctrl-C quit (the terminal is restored)."""

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import DataTable, Footer, Input, RichLog, Static

from broker.infra import connection
from broker.infra.outages import TRANSIENT_ERRORS
from broker.ops.feed import FeedEvent, FeedReader
from broker.settings import Settings
from gateway.console.data import FleetSnapshot, fleet_snapshot
from reach_cli.top_view import Rates, feed_line, rate, state_text

FEED_LINES = 1000


class TopApp(App[int]):
    TITLE = "reach top"
    CSS = """
    #status { height: 1; background: $primary-background; padding: 0 1; }
    #caps { height: auto; max-height: 40%; }
    #agents { height: auto; max-height: 40%; }
    .title { height: 1; padding: 0 1; text-style: bold; color: $text-muted; }
    #feed { height: 1fr; min-height: 5; border-top: solid $primary-background; }
    #filter { dock: bottom; display: none; }
    #filter.shown { display: block; }
    """
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
        Binding("p", "pause", "Pause feed"),
        Binding("f", "filter", "Filter capability"),
        Binding("escape", "close_filter", "Close filter", show=False),
    ]

    def __init__(self, settings: Settings, capability: str | None = None, refresh_s: float = 1.0) -> None:
        super().__init__()
        self.settings = settings
        self.only = capability
        self.refresh_s = refresh_s
        self.paused = False
        self.held: list[FeedEvent] = []
        self.rates = Rates()
        self.reader = FeedReader(settings)
        self.redis = connection.sync_client(settings)
        self.error: str | None = None

    def compose(self) -> ComposeResult:
        yield Static("", id="status")
        with Vertical():
            yield Static("Capabilities", classes="title")
            yield DataTable(id="caps", cursor_type="none", zebra_stripes=True)
            yield Static("Agents", classes="title")
            yield DataTable(id="agents", cursor_type="none", zebra_stripes=True)
            yield RichLog(id="feed", max_lines=FEED_LINES, wrap=False)
        yield Input(placeholder="capability to show (empty: all), Enter", id="filter")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#caps", DataTable).add_columns(
            "capability", "queued", "scheduled", "running", "inboxes", "dead", "oldest", "agents",
            "in/s", "done/s", "failed/s", "")
        self.query_one("#agents", DataTable).add_columns(
            "agent", "state", "capabilities", "in flight", "backlog", "p50 ms", "success", "heartbeat")
        self.refresh_data()
        self.set_interval(self.refresh_s, self.refresh_data)

    @work(thread=True, exclusive=True, group="read")
    def refresh_data(self) -> None:
        try:
            snapshot = fleet_snapshot(self.redis, self.settings)
            events = self.reader.read(self.redis, [q.capability for q in snapshot.queues])
            self.error = None
        except TRANSIENT_ERRORS as exc:
            self.error = f"cannot reach Redis ({type(exc).__name__}); retrying"
            self.call_from_thread(self._show_status)
            return
        self.call_from_thread(self._show, snapshot, events)

    def _show(self, snapshot: FleetSnapshot, events: list[FeedEvent]) -> None:
        self.rates.add(events)
        self._fill_capabilities(snapshot)
        self._fill_agents(snapshot)
        wanted = [e for e in events if self.only is None or e.is_agent_event or e.capability == self.only]
        if self.paused:
            self.held += wanted
        else:
            self._write(wanted)
        self._show_status()

    def _fill_capabilities(self, snapshot: FleetSnapshot) -> None:
        table = self.query_one("#caps", DataTable)
        table.clear()
        for q in snapshot.queues:
            if self.only and q.capability != self.only:
                continue
            name = q.capability
            oldest = "-" if q.oldest_queued_age_s is None else f"{q.oldest_queued_age_s:.0f}s"
            table.add_row(name, str(q.queued), str(q.delayed), str(q.running), str(q.unread_in_inboxes),
                          str(q.dead_letters), oldest, f"{q.healthy_agents}/{q.agents}",
                          rate(self.rates.per_second(name, "queued")),
                          rate(self.rates.per_second(name, "succeeded")),
                          rate(self.rates.per_second(name, "failed")), "paused" if q.paused else "")

    def _fill_agents(self, snapshot: FleetSnapshot) -> None:
        table = self.query_one("#agents", DataTable)
        table.clear()
        for view in snapshot.agents:
            r = view.row
            if self.only and self.only not in r.capabilities:
                continue
            table.add_row(r.agent_id, state_text(r.state), ",".join(r.capabilities),
                          f"{r.inflight}/{r.max_concurrency}", str(r.backlog),
                          "-" if r.latency_p50_ms is None else f"{r.latency_p50_ms:.0f}",
                          "-" if r.success_rate is None else f"{r.success_rate:.1%}",
                          f"{r.last_heartbeat_age_s:.1f}s")

    def _write(self, events: list[FeedEvent]) -> None:
        log = self.query_one("#feed", RichLog)
        for event in events:
            log.write(feed_line(event))

    def _show_status(self) -> None:
        parts = [f"capability: {self.only or 'all'}"]
        if self.paused:
            parts.insert(0, f"FEED PAUSED ({len(self.held)} waiting)")
        if self.error:
            parts.insert(0, self.error)
        parts.append(f"{self.settings.redacted_url()} prefix {self.settings.prefix!r}")
        self.query_one("#status", Static).update("  ·  ".join(parts))

    def action_pause(self) -> None:
        self.paused = not self.paused
        if not self.paused:
            self._write(self.held)
            self.held = []
        self._show_status()

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.add_class("shown")
        box.value = self.only or ""
        box.focus()

    def action_close_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.remove_class("shown")
        self.set_focus(None)

    def on_input_submitted(self, message: Input.Submitted) -> None:
        self.only = message.value.strip() or None
        self.action_close_filter()
        self.query_one("#feed", RichLog).clear()
        self._show_status()
        self.refresh_data()

    def on_unmount(self) -> None:
        self.redis.close()
