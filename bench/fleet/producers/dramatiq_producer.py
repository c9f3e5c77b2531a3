"""dramatiq's producer: `actor.send`; outcomes from the Results backend.

`message.get_result(block=True)` is a blocking pop on the message's result key; one thread here
does that pop on every outstanding key at once (BLPOP takes many keys), woken by a push on a key
of its own whenever a new task is sent, so a result is seen the moment it is stored.

    python -m bench.fleet.producers.dramatiq_producer --url URL --plan F --out F
"""

from __future__ import annotations

import json
import threading
from typing import Any

import redis

from bench.fleet.agents.dramatiq_agent import build
from bench.fleet.producers.common import Book, arguments, now_ms, pace, plan, wait_go

WAKE = "fleet-producer-wake"


class Watcher:
    def __init__(self, url: str, book: Book) -> None:
        self.r: Any = redis.Redis.from_url(url, decode_responses=True)
        self.book = book
        self.keys: dict[str, int] = {}
        self.lock = threading.Lock()

    def add(self, key: str, i: int) -> None:
        with self.lock:
            self.keys[key] = i
        self.r.lpush(WAKE, "1")

    def run(self) -> None:
        while not self.book.done.is_set():
            with self.lock:
                keys = [WAKE, *self.keys]
            popped = self.r.blpop(keys, timeout=1)
            if popped is None:
                continue
            key, value = popped
            if key == WAKE:
                continue
            with self.lock:
                i = self.keys.pop(key)
            try:
                data = json.loads(value)
                ok = not (isinstance(data, dict) and "__t" in data and "exn" in data)  # (an exception)
            except ValueError:
                ok = False
            self.book.see(i, ok)


def main() -> None:
    args = arguments()
    rate, durations = plan(args)
    book = Book(len(durations))
    _, backend, actor = build(args.url)
    watcher = Watcher(args.url, book)
    watcher.r.delete(WAKE)
    threading.Thread(target=watcher.run, daemon=True).start()
    t0 = wait_go()
    for i, duration in enumerate(durations):
        pace(t0, i, rate)
        at = now_ms()
        message: Any = actor.send(i, duration)
        book.submit(i, message.message_id, at)
        watcher.add(backend.build_message_key(message), i)
    book.done.wait(max(1.0, t0 / 1000 + len(durations) / rate + args.deadline_s - now_ms() / 1000))
    book.write(args.out)


if __name__ == "__main__":
    main()
