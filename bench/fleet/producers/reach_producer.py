"""Reach's producer: AsyncReachClient.submit, and each outcome through `handle.result()`.

    python -m bench.fleet.producers.reach_producer --url URL --prefix P --plan F --out F
"""

from __future__ import annotations

import asyncio
import contextlib
import sys

from bench.fleet.producers.common import Book, arguments, now_ms, plan, say
from broker import AsyncReachClient, TaskFailed, UnknownTask
from broker.ids import new_task_id
from broker.settings import Settings

CAPABILITY = "fleet"


async def wait_outcome(handle: object, i: int, book: Book, timeout: float) -> None:
    try:
        await handle.result(timeout=timeout)  # type: ignore[attr-defined]
        book.see(i, True)
    except TaskFailed:
        book.see(i, False)
    except TimeoutError:
        pass  # never seen: counted as unfinished


async def produce() -> None:
    args = arguments(["prefix"])
    rate, durations = plan(args)
    book = Book(len(durations))
    client = AsyncReachClient(Settings.load(redis_url=args.url, prefix=args.prefix))
    with contextlib.suppress(UnknownTask):
        await client.status(new_task_id(CAPABILITY))  # (connect before anything is timed)
    say("READY")
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    t0 = float(line.split()[1])
    waits = []
    horizon = len(durations) / rate + args.deadline_s
    for i, duration in enumerate(durations):
        delay = (t0 + i * 1000 / rate - now_ms()) / 1000
        if delay > 0:
            await asyncio.sleep(delay)
        at = now_ms()
        handle = await client.submit(CAPABILITY, {"i": i, "d": duration})
        book.submit(i, handle.task_id, at)
        left = horizon - (at - t0) / 1000
        waits.append(asyncio.create_task(wait_outcome(handle, i, book, max(left, 1.0))))
    await asyncio.gather(*waits)
    book.write(args.out)
    await client.close()


if __name__ == "__main__":
    asyncio.run(produce())
