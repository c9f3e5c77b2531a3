"""Stands in for a fleet of agents while the dispatcher is measured: drains their inboxes.

For every inbox (one per simulated agent) it reads new entries through the `agents` group and,
in one small script per read (every inbox it read from), acknowledges and deletes them and
publishes for each inbox the same `free <cap> <agent> <len> <pending>` wake-up that Reach's
complete script sends, so the dispatcher sees the capacity come back exactly as with real
workers. It runs no tasks and is kept cheap: it stands in for agents on other machines, while
the dispatcher is what is measured.

    python -m bench.workers.sim_consumer --url URL --prefix P --cap sim --agents 100
"""

from __future__ import annotations

import argparse
from typing import Any

import redis

from bench.workers.control import Control, Span
from broker.keys import AGENT_GROUP, CapabilityKeys, Channels

# KEYS: the inboxes read from; ARGV[1] wake channel, ARGV[2] capability, then per inbox: its
# agent id, its entry count k, then its k entry ids. (Everything read is acknowledged, so
# nothing stays pending.)
FREE = """
local a = 3
for i = 1, #KEYS do
  local agent, k = ARGV[a], tonumber(ARGV[a + 1])
  local ids = {unpack(ARGV, a + 2, a + 1 + k)}
  redis.call('XACK', KEYS[i], 'agents', unpack(ids))
  redis.call('XDEL', KEYS[i], unpack(ids))
  local len = redis.call('XLEN', KEYS[i])
  redis.call('PUBLISH', ARGV[1], 'free ' .. ARGV[2] .. ' ' .. agent .. ' ' .. len .. ' 0')
  a = a + 2 + k
end
return #KEYS
"""


def agent_ids(count: int) -> list[str]:
    return [f"sim-{i:05d}" for i in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--cap", required=True)
    parser.add_argument("--agents", type=int, required=True)
    args = parser.parse_args()
    r: Any = redis.Redis.from_url(args.url, decode_responses=True)
    keys = CapabilityKeys(args.prefix, args.cap)
    wake = Channels(args.prefix).wake
    streams = {keys.inbox(agent): ">" for agent in agent_ids(args.agents)}
    free = r.register_script(FREE)
    span = Span()
    control = Control(span)
    r.ping()
    control.ready()
    control.go.wait()
    while not control.stop.is_set():
        reply = r.xreadgroup(AGENT_GROUP, "sim", streams, count=200, block=100)
        if not reply:
            continue
        read_from: list[str] = []
        argv: list[Any] = [wake, args.cap]
        total = 0
        for stream, entries in reply:
            read_from.append(stream)
            argv += [stream.rsplit(":inbox:", 1)[1], len(entries), *(entry_id for entry_id, _ in entries)]
            total += len(entries)
        free(keys=read_from, args=argv)
        span.mark(0, total)


if __name__ == "__main__":
    main()
