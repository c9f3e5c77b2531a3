"""Reach with metrics on, side by side with the `reach` row in the same run (issue 24: the
drains and the round trip stay within 5 % of metrics off): every worker and the dispatcher
serve /metrics, and a scraper reads each of them every SCRAPE_EVERY_S (Prometheus' default is
15 s: this is harsher), from this process, all through the repetition.

    python -m bench --only reach,reach-metrics
"""

from __future__ import annotations

import threading
import urllib.request
from typing import Any

from bench.context import Bench
from bench.rows.reach import ReachRow
from broker.infra.embedded import free_port

SCRAPE_EVERY_S = 1.0


class ReachMetricsRow(ReachRow):
    key = "reach-metrics"
    title = "Reach, metrics on"
    opt_in = True

    def __init__(self, bench: Bench) -> None:
        super().__init__(bench)
        self.urls: list[str] = []
        self.scrapes = 0
        self.failed_scrapes = 0
        self._stop = threading.Event()
        self._scraper: threading.Thread | None = None

    def settings(self) -> dict[str, Any]:
        return {**super().settings(),
                "metrics": f"--metrics-addr 127.0.0.1:<free port> on every worker and the dispatcher; "
                           f"each scraped every {SCRAPE_EVERY_S:g} s during the repetition"}

    def process_args(self, name: str) -> list[str]:
        port = free_port()
        self.urls.append(f"http://127.0.0.1:{port}/metrics")
        return ["--metrics-addr", f"127.0.0.1:{port}"]

    def begin(self) -> None:
        super().begin()
        self.urls = []
        self._stop.clear()
        self._scraper = threading.Thread(target=self._scrape, name="bench-scraper", daemon=True)
        self._scraper.start()

    def cleanup(self) -> None:
        self._stop.set()
        if self._scraper is not None:
            self._scraper.join(10)
        super().cleanup()

    def _scrape(self) -> None:
        while not self._stop.wait(SCRAPE_EVERY_S):
            for url in list(self.urls):
                try:
                    with urllib.request.urlopen(url, timeout=5) as reply:
                        reply.read()
                    self.scrapes += 1
                except OSError:  # (a process of an earlier phase, stopped)
                    self.failed_scrapes += 1
