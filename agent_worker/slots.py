"""A worker's slots: how many more tasks it may start now (its concurrency less what runs).

A plain counter: everything runs on one event loop, so no lock is needed. Readers reserve
slots before they read their inbox and release what they did not use; a task's slot comes back
when its attempt ends (or, for a sync handler still running past its timeout, when its call
returns: see attempts.py). `held` counts slots taken by handlers past their timeout, which the
heartbeat reports so that dispatchers send the worker that much less.
"""

from __future__ import annotations

import asyncio


class Slots:
    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self.free = concurrency
        self.held = 0
        self.closed = False
        """The worker stops: nothing more is reserved."""
        self.paused = False
        """Nothing is reserved until resumed (the HTTP agent behind the worker is not ready)."""
        self._freed = asyncio.Event()

    async def reserve(self, most: int) -> int:
        """Up to `most` slots, waiting for one to be free (and for a pause to end); 0 once closed."""
        while (self.free <= 0 or self.paused) and not self.closed:
            self._freed.clear()
            await self._freed.wait()
        if self.closed:
            return 0
        n = min(most, self.free)
        self.free -= n
        return n

    def release(self, n: int) -> None:
        if n > 0:
            self.free += n
            self._freed.set()

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        self._freed.set()

    def close(self) -> None:
        self.closed = True
        self._freed.set()  # (readers waiting for a slot see that the worker stops)
