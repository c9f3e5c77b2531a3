"""callback_arm.lua and callback.lua against each Redis: only the current attempt's callback is
taken, once; a stale, forged or unknown one is refused and changes nothing."""

from __future__ import annotations

from typing import Any

from broker.keys import Channels
from broker.protocol.callbacks import (
    arm_call,
    callback_call,
    callback_key,
    new_token,
    outcome_field,
    parse_status,
    parse_token,
)
from broker.protocol.calls import Status
from broker.scripts import Scripts
from broker.settings import Settings

TASK = "cbcap:01JB0000000000000000000000"


def _task(r: Any, settings: Settings, state: str, fence: str, agent: str = "a1") -> str:
    key = f"{settings.prefix}:{{cbcap}}:task:01JB0000000000000000000000"
    r.hset(key, mapping={"id": TASK, "state": state, "fence": fence, "agent_id": agent})
    return key


def test_only_the_current_attempts_callback_is_taken_once(r: Any, settings: Settings) -> None:
    scripts = Scripts(r)
    _task(r, settings, "running", "1")
    first, first_sha = new_token("1")
    assert parse_status(scripts(arm_call(settings, TASK, "1", "a1", first_sha, 60_000))) is Status.OK
    assert parse_status(scripts(arm_call(settings, TASK, "1", "other", first_sha, 60_000))) is Status.STALE
    _task(r, settings, "running", "2")  # (the attempt was superseded: a new fence)
    assert parse_status(scripts(arm_call(settings, TASK, "1", "a1", first_sha, 60_000))) is Status.STALE
    second, second_sha = new_token("2")
    assert parse_status(scripts(arm_call(settings, TASK, "2", "a1", second_sha, 60_000))) is Status.OK

    pubsub = r.pubsub()
    pubsub.subscribe(Channels(settings.prefix).control("a1"))

    def call(token: str, outcome: str = '{"status":"success"}') -> Status:
        parsed = parse_token(token)
        assert parsed is not None
        return parse_status(scripts(callback_call(settings, TASK, parsed, outcome)))

    assert call(first) is Status.STALE
    forged = "2." + "A" * 32
    assert call(forged) is Status.REFUSED
    assert r.hget(callback_key(settings, TASK), outcome_field("2")) is None
    assert call(second) is Status.OK
    assert r.hget(callback_key(settings, TASK), outcome_field("2")) == '{"status":"success"}'
    assert call(second, '{"status":"failure"}') is Status.DUP
    assert r.hget(callback_key(settings, TASK), outcome_field("2")) == '{"status":"success"}'
    messages = []
    for _ in range(20):
        message = pubsub.get_message(timeout=0.2)
        if message and message["type"] == "message":
            messages.append(message["data"])
    assert messages == [f"callback {TASK}"]
    pubsub.close()
    assert 0 < r.pttl(callback_key(settings, TASK)) <= 60_000
    _task(r, settings, "succeeded", "2")
    assert call(second) is Status.STALE


def test_a_task_that_does_not_exist(r: Any, settings: Settings) -> None:
    token, sha = new_token("1")
    scripts = Scripts(r)
    assert parse_status(scripts(arm_call(settings, TASK, "1", "a1", sha, 1000))) is Status.GONE
    parsed = parse_token(token)
    assert parsed is not None
    assert parse_status(scripts(callback_call(settings, TASK, parsed, "{}"))) is Status.GONE
