"""The contract between Python and the Lua scripts: every text format that crosses between
them is written and read back the same way, the scripts spell no key, channel or group name of
their own, and every status word they answer with is one the parsers know."""

from __future__ import annotations

import json
import math
import re
from dataclasses import fields
from pathlib import Path
from typing import Any, get_type_hints

import pytest

from broker.keys import LUA_CONSTANTS, Channels
from broker.protocol import queue_score, wake
from broker.protocol.calls import Status
from broker.protocol.grants import Explanation, Grant, Pull
from broker.protocol.health import (
    SPEED_ALPHA,
    SPEED_FLOOR_MS,
    SPEED_KNOWN,
    SPEED_TELL_FACTOR,
    AgentHealth,
    parse_health,
)
from broker.protocol.submit import SubmitFields, SubmitOptions, options_of
from broker.scripts import prelude

LUA = Path(__file__).resolve().parent.parent / "broker" / "lua"

pytestmark = pytest.mark.one_redis


@pytest.mark.parametrize("message", [
    wake.TasksQueued("summarize"),
    wake.RegistryChanged("agent-1"),
    wake.AgentFreed("summarize", "agent-1", 7, 3, 0, 4, 812.0, 2),
    wake.AgentFreed("summarize", "agent-1", 7, 3, 0, 4, 812.0, 2, (203.4, 17)),
    wake.GrantsTaken("summarize", "agent-1", 5, -1, 2, 6),
    wake.GrantsTaken("summarize", "agent-1", 5, -1, 1, None),
])
def test_wake_messages_read_back_as_written(message: wake.WakeMessage) -> None:
    assert wake.parse(message.encode()) == message


def test_wake_messages_of_older_producers_and_strangers() -> None:
    # (free without speed or pull, as a producer of an older release sends it)
    assert wake.parse("free cap a 3 1") == wake.AgentFreed("cap", "a", 3, 1)
    assert wake.parse("free cap a 3 1 2") == wake.AgentFreed("cap", "a", 3, 1, 2)
    # A speed that is no number is no news; the load still is.
    assert wake.parse("free cap a 3 1 0 1 nan 0") == wake.AgentFreed("cap", "a", 3, 1, 0, 1, None, 0)
    # So is a speed that does not parse (or half of one).
    assert wake.parse("free cap a 3 1 0 1 9 0 x 5") == wake.AgentFreed("cap", "a", 3, 1, 0, 1, 9.0, 0)
    assert wake.parse("free cap a 3 1 0 1 9 0 inf 5") == wake.AgentFreed("cap", "a", 3, 1, 0, 1, 9.0, 0)
    for junk in ("", "task", "free cap a x 1", "took cap a 1 2", "hello world", "agent", "task a b",
                 "free cap a 3 1 0 1 9 0 5.0"):
        assert wake.parse(junk) is None, junk


def test_grants_pulls_and_explanations_read_back_as_written() -> None:
    for grant in (Grant("a-1", 40, "t.1f", 71.5), Grant("a-2", 8, "", 1.0, True)):
        assert Grant.parse(grant.encode()) == grant
    for pull in (Pull(40, "t.2", 55.0), Pull(1, "", 3.5, True)):
        assert Pull.parse(pull.encode()) == pull
    for decision in (Explanation("t.3", "weighted", 64.2, 12), Explanation("t.3", "grant", 50.0, None)):
        assert Explanation.parse(decision.encode()) == decision
    assert Grant.parse("a|x|r|1|") is None and Grant.parse("|1|r|1|") is None and Grant.parse("a|1") is None
    assert Pull.parse("1|r|1") is None and Explanation.parse("a|b") is None and Explanation.parse("") is None


def test_the_health_hash_parses_per_agent_and_skips_what_does_not() -> None:
    parsed = parse_health({"cf:a": "3", "lf:a": "100", "ok:b": "5", "cs:a": "x", "junk": "1", "zz:a": "1"})
    assert parsed == {"a": AgentHealth(consecutive_failures=3, last_failure_ms=100),
                      "b": AgentHealth(last_success_ms=5)}
    speeds = parse_health({"sp:a": "41.5 17 40.0", "sp:b": "nan 3 0", "sp:c": "12", "sp:d": "-1 2 0"})
    assert speeds == {"a": AgentHealth(speed_ms=41.5, speed_samples=17)}


def test_the_speed_constants_are_the_scripts() -> None:
    text = (LUA / "_health.lua").read_text(encoding="utf-8")
    found = re.search(r"local alpha, known, floor, tell = ([\d.]+), (\d+), ([\d.]+), ([\d.]+)", text)
    assert found is not None
    assert tuple(map(float, found.groups())) == (SPEED_ALPHA, SPEED_KNOWN, SPEED_FLOOR_MS, SPEED_TELL_FACTOR)


def _python_speed(ms: float, n: int, times: list[float]) -> tuple[float, int]:
    log = math.log(ms) if n else 0.0
    for t in times:
        n += 1
        log += max(SPEED_ALPHA, 1 / n) * (math.log(max(t, SPEED_FLOOR_MS)) - log)
    return math.exp(log), n


def test_the_scripts_speed_is_a_moving_geometric_mean_told_when_it_is_news(r: Any) -> None:
    script = prelude() + "\nlocal s = speed_after(KEYS[1], ARGV[1], cjson.decode(ARGV[2]))" \
                         "\nif not s then return false end\nreturn {s[1], tostring(s[4]), tostring(s[5])}"

    def after(times: list[float]) -> tuple[float, int, bool, float] | None:
        reply = r.eval(script, 1, "h:speed", "a", json.dumps(times))
        if not reply:
            return None
        ms, n = reply[0].split(" ")
        return float(ms), int(n), reply[1] == "true", float(reply[2])

    r.delete("h:speed")
    assert after([]) is None  # (no success: nothing to count)
    # The first tasks: a plain mean of their logs (1 ms counts as the floor), not yet news.
    assert after([40, 40, 1]) == (round(_python_speed(0, 0, [40, 40, 1])[0], 1), 3, False, 0.0)
    r.hset("h:speed", "sp:a", "40.0 4 0.0")
    ms, n, news, told = after([40]) or (0, 0, False, 0)
    assert (round(ms), n, news, told) == (40, 5, True, 0.0)  # known now: news
    r.hset("h:speed", "sp:a", "40.0 50 40.0")
    spread = after([50, 30, 60, 90])
    assert spread is not None and not spread[2]  # (an ordinary spread is no news)
    # A task ten times slower moves it 10 ** 0.2 = 1.58 x: news (the dispatchers route again;
    # it takes three such tasks in a row to be three times slower).
    one, three = after([400]), after([400, 400, 400])
    assert one is not None and three is not None and one[2] and three[2]
    assert one[0] == pytest.approx(40.0 * 10 ** SPEED_ALPHA, abs=0.05)
    assert three[0] == pytest.approx(_python_speed(40.0, 50, [400] * 3)[0], abs=0.05)
    assert three[0] > 3 * 40
    r.delete("h:speed")


@pytest.mark.parametrize("constrained", [False, True])
def test_the_scripts_queue_score_is_the_python_one_and_decodes(r: Any, constrained: bool) -> None:
    script = prelude() + "\nreturn queue_score(tonumber(ARGV[1]), tonumber(ARGV[2]), " \
                         "tonumber(ARGV[3]), ARGV[4] == '1')"
    for now in (1_764_000_000_000, 4_000_000_000_000):
        for priority in range(10):
            lua = float(r.eval(script, 0, now, priority, 30_000, "1" if constrained else ""))
            assert lua == queue_score.encode(now, priority, 30_000, constrained)
            assert queue_score.decode(lua) == (priority, constrained)


def test_submit_fields_are_the_submit_options() -> None:
    options = {f.name: get_type_hints(SubmitOptions)[f.name] for f in fields(SubmitOptions)}
    assert get_type_hints(SubmitFields) == options
    assert options_of(SubmitOptions(priority=2, region="eu"), {"priority": 7}) == SubmitOptions(
        priority=7, region="eu")


def _lua_sources() -> dict[str, str]:
    return {path.name: path.read_text(encoding="utf-8") for path in sorted(LUA.glob("*.lua"))}


def test_no_script_spells_a_key_channel_or_group_name_of_its_own() -> None:
    # Every name comes from broker/keys.py: in KEYS/ARGV (prefix-dependent) or as a constant of
    # the prelude (AGENT_GROUP, DONE_SUFFIX, ...).
    names = [*LUA_CONSTANTS.values(), ":wake", ":ev:", ":ctl:", "wake", "ev:", "ctl:"]
    literal = re.compile(r"'([^']*)'")
    for name, text in _lua_sources().items():
        code = "\n".join(line.split("--", 1)[0] for line in text.splitlines())
        for found in literal.findall(code):
            assert found not in names, f"{name} spells {found!r}: take it from broker/keys.py"


def test_every_status_a_script_returns_is_one_the_parsers_know() -> None:
    known = {s.value for s in Status}
    returned = re.compile(r"return\s*\{?\s*'([a-z_]+)'")
    statuses = re.compile(r"status\s*=\s*'([a-z_]+)'|row\('([a-z_]+)'|out\[#out \+ 1\] = '([a-z_]+)'")
    for name, text in _lua_sources().items():
        if name.startswith("dlq_") or name in ("_base.lua", "_events.lua", "_finish.lua"):
            # (The DLQ tools' scripts answer in their own words, parsed in dlq_tools/calls.py;
            # those helpers return JSON text, not statuses.)
            continue
        found = set(returned.findall(text))
        for groups in statuses.findall(text):
            found.update(g for g in groups if g)
        assert found <= known, f"{name}: {sorted(found - known)} not in broker.protocol.calls.Status"


def test_channels_are_prefix_plus_name() -> None:
    channels = Channels("p")
    assert channels.task("cap:1") == channels.task_prefix + "cap:1"
    assert channels.control("a") == channels.control_prefix + "a"
