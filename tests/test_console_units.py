"""The console's and `reach top`'s pure parts: sessions and CSRF tokens, the feed's parsing,
what pages print (times, durations, sparklines), the rates `reach top` measures."""

from __future__ import annotations

import time

from broker.ops.feed import REGISTRY, FeedEvent, parse_registry_entry, parse_task_lines
from gateway.console import session as sessions
from gateway.console.render import ENV, ago, clock, jsonish, shown, spark_points
from reach_cli.top_view import Rates, feed_line

SECRET = b"s" * 32


def test_a_session_cookie_round_trips_and_is_bound_to_its_key() -> None:
    s = sessions.new_session("ab12cd34")
    cookie = sessions.encode(SECRET, s, key_sha="f" * 64)
    decoded = sessions.decode(cookie)
    assert decoded is not None
    session, mac = decoded
    assert session == s
    assert sessions.check(SECRET, session, mac, "f" * 64)
    assert not sessions.check(SECRET, session, mac, "e" * 64)  # (another key, or the key re-made)
    assert not sessions.check(b"x" * 32, session, mac, "f" * 64)  # (another secret)
    forged = sessions.Session("99999999", s.nonce, s.expires_s)  # (another key id, same mac)
    assert not sessions.check(SECRET, forged, mac, "f" * 64)


def test_malformed_or_expired_cookies_are_no_session() -> None:
    for value in (None, "", "a.b.c", "a.b.c.d.e", "-.nonce.notanumber.mac", "-.no nce.123.mac",
                  "x" * 500, "-.abc.1.mac"):
        assert sessions.decode(value) is None
    old = sessions.new_session(now_s=time.time() - sessions.SESSION_TTL_S - 10)
    assert sessions.decode(sessions.encode(SECRET, old)) is None


def test_csrf_tokens_belong_to_one_session() -> None:
    a, b = sessions.new_session(), sessions.new_session()
    token = sessions.csrf_token(SECRET, a)
    assert sessions.csrf_ok(SECRET, a, token)
    assert not sessions.csrf_ok(SECRET, b, token)
    assert not sessions.csrf_ok(SECRET, a, None)
    assert not sessions.csrf_ok(SECRET, a, "")
    assert not sessions.csrf_ok(SECRET, a, token[:-1] + "0" if token[-1] != "0" else token[:-1] + "1")


def test_feed_lines_parse_and_a_stranger_s_line_is_skipped() -> None:
    text = ("cap:01J|3|succeeded|1700000000123|2|agent-1|{\"exec_ms\":5}\n"
            "garbage\n"
            "cap:01K|1|queued|notatime|0||{}\n"
            "cap:01L|1|queued|1700000000200|x||{\"a\":\"b|c\"}")
    events = parse_task_lines("cap", text)
    assert [(e.task_id, e.type, e.attempt, e.agent_id) for e in events] == [
        ("cap:01J", "succeeded", 2, "agent-1"), ("cap:01L", "queued", 0, "")]
    assert events[1].detail == '{"a":"b|c"}'
    agent = parse_registry_entry("1700000000300-0", {"type": "state", "agent_id": "a1",
                                                     "detail": "healthy -> offline"})
    assert agent.is_agent_event and agent.time_ms == 1700000000300 and agent.capability == REGISTRY
    assert parse_registry_entry("1700000000400-0", {}).time_ms == 1700000000400


def test_what_pages_print() -> None:
    assert (ago(None), ago(4.25), ago(75), ago(7500), ago(200_000)) == (
        "-", "4.2s", "1m 15s", "2h 5m", "2d 7h")
    assert clock(1_700_000_000_123) == "11-14 22:13:20.123"
    assert clock(1_700_000_000_123, ms=False) == "11-14 22:13:20" and clock(None) == "-"
    assert jsonish(True) == "true" and jsonish("text") == "text" and jsonish(None) == "null"
    text, cut = shown({"k": "v" * 5000})
    assert cut > 0 and len(text) == 4000
    points = spark_points([0, 5, 10])
    assert points.split() == ["0.0,23.0", "60.0,12.0", "120.0,1.0"]
    assert spark_points([0, 0]) == "0.0,23.0 120.0,23.0"


def test_templates_escape_what_a_task_carries() -> None:
    html = ENV.get_template("_feed_item.html").render(event=FeedEvent(
        "cap", "queued", 1_700_000_000_000, task_id="cap:<script>", agent_id="<b>x</b>"))
    assert "<script>" not in html and "&lt;script&gt;" not in html.split('href="')[1].split('"')[0]
    assert "&lt;b&gt;x&lt;/b&gt;" in html


def test_top_rates_count_the_window_only() -> None:
    now = int(time.time() * 1000)
    rates = Rates(window_s=10)
    rates.add([FeedEvent("a", "succeeded", now - 1000), FeedEvent("a", "succeeded", now - 2000),
               FeedEvent("a", "succeeded", now - 60_000), FeedEvent("b", "queued", now - 500),
               FeedEvent(REGISTRY, "state", now)])
    assert rates.per_second("a", "succeeded", now) == 0.2
    assert rates.per_second("b", "queued", now) == 0.1
    assert rates.per_second("a", "failed", now) == 0.0
    line = feed_line(FeedEvent("a", "failed", now, task_id="a:01J", attempt=3, agent_id="w1"))
    assert "failed" in line.plain and "a:01J" in line.plain and "attempt 3" in line.plain
