"""The contract between Python and the Lua scripts: every text format that crosses between
them is written and read back the same way, the scripts spell no key, channel or group name of
their own, and every status word they answer with is one the parsers know."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path
from typing import Any, get_type_hints

import pytest

from broker.keys import LUA_CONSTANTS, Channels
from broker.protocol import queue_score, wake
from broker.protocol.calls import Status
from broker.protocol.grants import Explanation, Grant, Pull
from broker.protocol.health import AgentHealth, parse_health
from broker.protocol.submit import SubmitFields, SubmitOptions, options_of
from broker.scripts import prelude

LUA = Path(__file__).resolve().parent.parent / "broker" / "lua"

pytestmark = pytest.mark.one_redis


@pytest.mark.parametrize("message", [
    wake.TasksQueued("summarize"),
    wake.RegistryChanged("agent-1"),
    wake.AgentFreed("summarize", "agent-1", 7, 3, 0, 4, 812.0, 2),
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
    for junk in ("", "task", "free cap a x 1", "took cap a 1 2", "hello world", "agent", "task a b"):
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
