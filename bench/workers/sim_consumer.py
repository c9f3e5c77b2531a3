"""Stands in for a fleet of agents while the dispatcher is measured: drains their inboxes.

It runs no tasks, and whatever it does costs the Redis the dispatcher is measured against (and,
on two cores, the core that Redis runs on), so there are two ways to be that fleet:

- `read`: every inbox is read through the `agents` group, as an agent reads it (one
  `XREADGROUP` over all the inboxes), and one small script per read acknowledges and deletes
  what was read and sends each inbox's `free <cap> <agent> <len> <pending>` wake-up, as Reach's
  complete script does (sim_read_free.lua).
- `trim`: agents that finish every task the moment it arrives. The consumer follows the
  capability's event feed (one `XREAD` of one stream), where every dispatch call writes a line
  per task it handed off, naming the agent; then one script empties those inboxes and sends
  their `free` wake-ups (sim_trim_free.lua). Every 100 ms it empties every inbox anyway, so
  that a feed line it missed (trimmed from the feed before it read it) cannot leave an inbox
  full for long. (It needs the feed: event_feed_maxlen > 0, the default.)

Either way the dispatcher sees the capacity come back as it does with real workers: the same
wake-ups, inbox lengths that fall to what is left.

    python -m bench.workers.sim_consumer --url URL --prefix P --cap sim --agents 100 --mode trim
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import redis

from bench.workers.control import Control, Span
from broker.keys import AGENT_GROUP, CapabilityKeys, Channels

HERE = Path(__file__).parent
MODES = ("read", "trim")
SWEEP_EVERY_S = 0.1


def agent_ids(count: int) -> list[str]:
    return [f"sim-{i:05d}" for i in range(count)]


def dispatched_to(events: str) -> set[str]:
    """The agents named by the `dispatched` lines of one feed entry (`id|seq|type|time|attempt|
    agent|data`, see broker/lua/_events.lua). (broker/client/events.py's feed_events reads the same lines
    into whole events, JSON data included: more than a stand-in that must stay cheap needs.)"""
    agents = set()
    for line in events.split("\n"):
        parts = line.split("|", 6)
        if len(parts) == 7 and parts[2] == "dispatched":
            agents.add(parts[5])
    return agents


def read_and_free(r: Any, keys: CapabilityKeys, wake: str, cap: str, agents: list[str],
                  control: Control, span: Span) -> None:
    free = r.register_script((HERE / "sim_read_free.lua").read_text())
    streams = {keys.inbox(agent): ">" for agent in agents}
    while not control.stop.is_set():
        reply = r.xreadgroup(AGENT_GROUP, "sim", streams, count=200, block=100)
        if not reply:
            continue
        read_from: list[str] = []
        argv: list[Any] = [wake, cap]
        total = 0
        for stream, entries in reply:
            read_from.append(stream)
            argv += [stream.rsplit(":inbox:", 1)[1], len(entries), *(entry_id for entry_id, _ in entries)]
            total += len(entries)
        free(keys=read_from, args=argv)
        span.mark(0, total)


def trim_and_free(r: Any, keys: CapabilityKeys, wake: str, cap: str, agents: list[str],
                  control: Control, span: Span, start: str) -> None:
    trim = r.register_script((HERE / "sim_trim_free.lua").read_text())
    last = start
    next_sweep = time.monotonic() + SWEEP_EVERY_S
    while not control.stop.is_set():
        reply = r.xread({keys.events: last}, count=100, block=int(SWEEP_EVERY_S * 1000))
        touched: set[str] = set()
        for entry_id, fields in reply[0][1] if reply else []:
            last = entry_id
            touched |= dispatched_to(fields.get("events", ""))
        targets = sorted(touched)
        if time.monotonic() >= next_sweep:
            targets, next_sweep = agents, time.monotonic() + SWEEP_EVERY_S
        if targets:
            removed = trim(keys=[keys.inbox(agent) for agent in targets], args=[wake, cap, *targets])
            span.mark(0, int(removed))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--cap", required=True)
    parser.add_argument("--agents", type=int, required=True)
    parser.add_argument("--mode", choices=MODES, default="read")
    args = parser.parse_args()
    r: Any = redis.Redis.from_url(args.url, decode_responses=True)
    keys = CapabilityKeys(args.prefix, args.cap)
    wake = Channels(args.prefix).wake
    span = Span()
    control = Control(span)
    newest = r.xrevrange(keys.events, count=1)  # (what came before the dispatcher is not ours)
    control.ready()
    control.go.wait()
    agents = agent_ids(args.agents)
    if args.mode == "read":
        read_and_free(r, keys, wake, args.cap, agents, control, span)
    else:
        trim_and_free(r, keys, wake, args.cap, agents, control, span, newest[0][0] if newest else "0-0")


if __name__ == "__main__":
    main()
