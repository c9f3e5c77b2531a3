"""A Celery agent: `celery worker` on the fleet app, threads pool, concurrency 4 by default.

Prints READY when Celery's worker_ready signal fires. The threads pool rather than prefork: the
task only sleeps (as an agent waiting on an LLM does), and eight prefork workers of five
processes each would load this 2-core machine for nothing. Prefetch stays Celery's default.

    FLEET_REDIS_URL=... python -m bench.fleet.agents.celery_worker --name a1 [--concurrency 4]
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from celery.signals import worker_ready  # type: ignore[import-untyped]

from bench.fleet.agents.celery_app import QUEUE, app


@worker_ready.connect  # type: ignore[untyped-decorator]
def _ready(**_: Any) -> None:
    out = sys.__stdout__  # (Celery redirects sys.stdout to its logger)
    assert out is not None
    out.write("READY\n")
    out.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    app.worker_main(["worker", "--pool", "threads", "--concurrency", str(args.concurrency),
                     "--hostname", f"{args.name}@fleet", "--queues", QUEUE, "--loglevel", "WARNING"])


if __name__ == "__main__":
    main()
