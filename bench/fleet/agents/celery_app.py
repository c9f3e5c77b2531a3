"""The Celery agents and producer: one app on the Redis broker and result backend.

Settings (each said in the report): `task_acks_late` so that a task whose worker died is
delivered again; the Redis transport's `visibility_timeout` lowered from one hour to 30 s (Reach's
lease) with the unacked sweep every 10 s (kombu 5.7's options; an older kombu sweeps at its own
pace), or a killed worker's tasks would wait an hour; the
prefetch left at its default (4 x concurrency); retries with autoretry_for: 3 attempts in all,
exponential backoff from Celery's smallest factor (1 s) with its default full jitter.

    celery worker: python -m bench.fleet.agents.celery_worker (same app, threads pool)
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery  # type: ignore[import-untyped]

from bench.fleet.behaviour import AgentFailure, run_sync

QUEUE = "fleet"
VISIBILITY_TIMEOUT_S = 30
MAX_RETRIES = 2


def make_app(url: str) -> Celery:
    app = Celery("fleet", broker=url, backend=url)
    app.conf.update(
        task_acks_late=True,
        task_default_queue=QUEUE,
        task_serializer="json", result_serializer="json", accept_content=["json"],
        broker_transport_options={"visibility_timeout": VISIBILITY_TIMEOUT_S,
                                  "unacked_restore_interval": 10, "unacked_restore_throttle": 1},
        result_expires=3600,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    return app


app = make_app(os.environ.get("FLEET_REDIS_URL", "redis://127.0.0.1:6379/0"))


@app.task(name="fleet.work", autoretry_for=(AgentFailure,), max_retries=MAX_RETRIES,
          retry_backoff=1, retry_jitter=True)  # type: ignore[untyped-decorator]
def work(task: int, duration_ms: float) -> Any:
    return run_sync(task, duration_ms)
