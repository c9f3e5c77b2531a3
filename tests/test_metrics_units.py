"""The parts of metrics, probes and logs that need no Redis: the counters' parser, the log
formats, the address setting, the HTTP server and its probes (a real server on a free port)."""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter

from broker.errors import ConfigError
from broker.ids import local_id_ms, new_local_id
from broker.infra import logs
from broker.infra.metrics_server import MetricsServer
from broker.keys import finished_field
from broker.protocol.counters import parse_counters
from broker.script_source import SCRIPT_NAMES, source
from broker.settings import DISPATCHER_METRICS_ADDR, Settings


def test_counters_parse_and_derive_what_is_handed_out() -> None:
    raw = {"submitted": "10", "direct": "3", "routed": "5", "pulled": "2", "removed": "1",
           finished_field("succeeded"): "6", finished_field("failed", "expired"): "2",
           finished_field("canceled"): "1", "finished:weird:": "4", "retries": "x",
           "unserved_since": "123", "reroutes": "7"}
    c = parse_counters(raw)
    assert (c.submitted, c.dispatched, c.reroutes, c.retries) == (10, 10, 7, 0)
    assert c.finished == {("succeeded", ""): 6, ("failed", "expired"): 2, ("canceled", ""): 1}
    assert c.active == 10 - 6 - 1


def test_every_script_that_counts_gives_its_context_the_stats_key() -> None:
    counting = re.compile(r"\b(fail_task|count)\(c,")
    for name in SCRIPT_NAMES:
        text = source(name)
        body = text[text.index(f"-- ===== {name}.lua ====="):]
        if counting.search(text) and "context(" in body:
            call = re.search(r"context\(([^)]*)\)", body)
            assert call and len(call.group(1).split(",")) == 5, f"{name}: context() without the stats key"


def test_a_local_id_tells_when_it_was_made() -> None:
    assert local_id_ms(new_local_id(1_790_000_000_123)) == 1_790_000_000_123


def test_metrics_addr_is_checked_and_each_process_has_its_default() -> None:
    assert Settings.load(metrics_addr="0.0.0.0:0").metrics_address(None) == ("0.0.0.0", 0)
    assert Settings.load(metrics_addr="[::1]:9464").metrics_address(None) == ("::1", 9464)
    assert Settings.load(metrics_addr="off").metrics_address(DISPATCHER_METRICS_ADDR) is None
    assert Settings.load().metrics_address(None) is None
    assert Settings.load().metrics_address(DISPATCHER_METRICS_ADDR) == ("127.0.0.1", 9464)
    for bad in ("9464", "host:", "host:70000", ":80", "host:-1"):
        with pytest.raises(ConfigError, match="metrics_addr"):
            Settings.load(metrics_addr=bad)


@pytest.fixture
def captured() -> Iterator[list[logging.LogRecord]]:
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    handler.addFilter(logs.TaskFilter())
    logger = logging.getLogger("tests.units.logs")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield records
    logger.removeHandler(handler)


def test_lines_about_a_task_carry_its_fields_in_both_formats(captured: list[logging.LogRecord]) -> None:
    log = logging.getLogger("tests.units.logs")
    fields = logs.task_fields("cap:01ABC", "0123456789abcdef", "cap", 2)

    async def attempt() -> None:
        log.info("in the task")
        # (a sync handler's thread runs in a copy of the attempt's context)
        await asyncio.get_running_loop().run_in_executor(
            None, contextvars.copy_context().run, lambda: log.info("in its thread"))

    async def main() -> None:
        token = logs.bind_task(fields)
        try:
            task = asyncio.create_task(attempt())
        finally:
            logs.unbind_task(token)
        log.info("outside")
        await task

    asyncio.run(main())
    log.info("given one call", extra=logs.task_extra(fields))
    json_lines = {r.getMessage(): json.loads(logs.JsonFormatter().format(r)) for r in captured}
    assert set(json_lines) == {"in the task", "in its thread", "outside", "given one call"}
    for message, line in json_lines.items():
        assert {"time", "level", "logger", "message"} <= set(line)
        if message != "outside":
            about = (line["task_id"], line["trace_id"], line["attempt"])
            assert about == ("cap:01ABC", fields[1], 2), line
        else:
            assert "task_id" not in line
    in_task = next(r for r in captured if r.getMessage() == "in the task")
    text = logs.TextFormatter().format(in_task)
    assert text.endswith("[task_id=cap:01ABC trace_id=0123456789abcdef capability=cap attempt=2]")


def test_secrets_are_redacted_from_any_line() -> None:
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "cannot reach %s",
                               ("redis://app:p@ss:w0rd@host:6379/0?password=also",), None)
    for formatter in (logs.JsonFormatter(), logs.TextFormatter()):
        line = formatter.format(record)
        assert "w0rd" not in line and "also" not in line and "p@ss" not in line
        assert "redis://app:***@host:6379/0" in line


class _Probes:
    def __init__(self) -> None:
        self.ready = True

    def healthz(self) -> dict[str, Any]:
        return {"event_loop": True, "_age_s": 0.1}

    def readyz(self) -> dict[str, Any]:
        if self.ready is None:
            raise RuntimeError("the probe broke")
        return {"redis": self.ready}


def _get(url: str, method: str = "GET") -> tuple[int, str, str]:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return reply.status, reply.headers["Content-Type"], reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def test_the_server_serves_metrics_and_probes_and_answers_json_errors() -> None:
    registry = CollectorRegistry()
    Counter("reach_units_things", "things", registry=registry).inc(3)
    probes = _Probes()
    server = MetricsServer(registry, probes.healthz, probes.readyz)
    port = server.start("127.0.0.1", 0)
    base = f"http://127.0.0.1:{port}"
    try:
        status, kind, body = _get(f"{base}/metrics")
        assert status == 200 and "reach_units_things_total 3.0" in body and kind.startswith("text/plain")
        assert _get(f"{base}/healthz")[:2] == (200, "application/json")
        assert json.loads(_get(f"{base}/readyz")[2]) == {"status": "ok", "checks": {"redis": True}}
        probes.ready = False
        status, _, body = _get(f"{base}/readyz")
        assert status == 503 and json.loads(body)["status"] == "failing"
        probes.ready = None  # type: ignore[assignment]
        status, _, body = _get(f"{base}/readyz")
        assert status == 503 and "the probe broke" in body
        status, kind, body = _get(f"{base}/nowhere")
        assert status == 404 and kind == "application/json" and "error" in json.loads(body)
        status, _, body = _get(f"{base}/metrics", method="POST")
        assert status == 405 and "error" in json.loads(body)
        assert any(t.name == "reach-metrics" for t in threading.enumerate())
    finally:
        server.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"{base}/healthz", timeout=2)
