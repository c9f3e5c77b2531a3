"""Task search (`reach tasks`, broker/ops/search.py) against a real Redis and real scripts: the
index submit writes, where each state is found, paging by cursor, the read budget, pruning."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from dataclasses import replace
from typing import Any

import pytest

from broker import ReachClient, SubmitOptions
from broker.errors import BadInput
from broker.keys import CapabilityKeys
from broker.models import TaskState
from broker.ops.search import TaskQuery, find_tasks, search_tasks
from broker.ops.task_cursor import Position, decode_cursor
from broker.retention import prune_task_index
from broker.settings import Settings
from dlq_tools import DeadLetters
from tests.conftest import ROOT, Fleet, settings_env, wait_until

pytestmark = pytest.mark.one_redis

TRACE_OK = "0000000000000000000000000000a0c0"
TRACE_BAD = "00000000000000000000000000000bad"
NEEDLE = "0123456789abcdef0123456789abcdef"


def _ids(page: Any) -> list[str]:
    return [t.task_id for t in page.tasks]


def _all_pages(r: Any, settings: Settings, query: TaskQuery, budget: int = 5000) -> tuple[list[str], int]:
    """Every task the query finds, page after page; and how many pages that took."""
    found: list[str] = []
    pages = 0
    cursor = None
    while True:
        page = search_tasks(r, settings, replace(query, cursor=cursor), budget=budget)
        pages += 1
        found += _ids(page)
        cursor = page.next_cursor
        if cursor is None:
            return found, pages


def test_newest_first_across_capabilities_and_pages(client: ReachClient, settings: Settings, r: Any) -> None:
    # A batch of 300 in one submit call shares one server time: the cursor must page through
    # ties without repeating or skipping any.
    made = [h.task_id for h in client.submit_many("srcha", [{"i": i} for i in range(300)])]
    made += [client.submit("srchb", {"i": i}).task_id for i in range(40)]
    made += [h.task_id for h in client.submit_many("srchc", [{"i": i} for i in range(60)])]
    everything, pages = _all_pages(r, settings, TaskQuery(limit=37))
    assert sorted(everything) == sorted(made) and len(everything) == len(made)
    assert pages == len(made) // 37 + 1
    # Newest first: the last capability submitted comes first, srcha's batch last.
    assert everything[0].startswith("srchc:") and everything[-1].startswith("srcha:")
    only_b, _ = _all_pages(r, settings, TaskQuery(capability="srchb", limit=7))
    assert only_b == list(reversed([t for t in made if t.startswith("srchb:")]))


def test_each_state_is_found_where_it_lives(fleet: Fleet, client: ReachClient, settings: Settings,
                                            r: Any) -> None:
    dispatcher = fleet.dispatcher()
    worker = fleet.worker("srchw", handler="tests.gateway_handlers:work", concurrency=2)
    ok = [client.submit("srchw", {"n": i}, trace_id=TRACE_OK).task_id for i in range(5)]
    bad = client.submit("srchw", {"invalid": "no"}, trace_id=TRACE_BAD).task_id
    running = client.submit("srchw", {"sleep": 30}).task_id
    for task_id in [*ok, bad]:
        wait_until(lambda t=task_id: client.status(t).state.terminal, message=f"{task_id} ended")
    wait_until(lambda: client.status(running).state is TaskState.RUNNING, message="a running task")
    queued = client.submit("srchnobody", {"x": 1}).task_id
    scheduled = client.submit("srchw", {"x": 2}, SubmitOptions(delay_s=600)).task_id
    canceled = client.submit("srchnobody", {"x": 3}).task_id
    assert client.cancel(canceled)

    def find(**fields: Any) -> list[str]:
        return _ids(search_tasks(r, settings, TaskQuery(**fields)))

    assert find(state=TaskState.SUCCEEDED) == list(reversed(ok))
    assert find(state=TaskState.FAILED) == [bad]
    assert find(state=TaskState.RUNNING) == [running]
    assert find(state=TaskState.QUEUED) == [queued]
    assert find(state=TaskState.SCHEDULED) == [scheduled]
    assert find(state=TaskState.CANCELED) == [canceled]
    assert find(state=TaskState.CANCELED, capability="srchw") == []
    assert find(agent_id=worker.agent_id, state=TaskState.SUCCEEDED, limit=2) == list(reversed(ok))[:2]
    assert find(trace_id=TRACE_BAD) == [bad]
    assert find(agent_id="nobody-ran-these") == []
    assert find(since_ms=60_000, capability="srchnobody") == [canceled, queued]
    row = search_tasks(r, settings, TaskQuery(state=TaskState.FAILED)).as_dict()["tasks"][0]
    assert (row["task_id"], row["reason"], row["trace_id"]) == (bad, "invalid_request", TRACE_BAD)

    # A replayed dead letter leaves the failed ones and comes first again. The dispatcher is
    # stopped meanwhile, or the replay could run and fail again before the first look.
    dispatcher.signal(signal.SIGSTOP)
    try:
        with DeadLetters(settings) as dlq:
            dlq.replay(dlq.select([bad]))
        assert find(state=TaskState.FAILED) == []
        assert bad in find(state=TaskState.QUEUED)
    finally:
        dispatcher.signal(signal.SIGCONT)
    wait_until(lambda: client.status(bad).state is TaskState.FAILED, message="the replay failing again")
    assert find(state=TaskState.FAILED) == [bad]
    assert find(capability="srchw", limit=1) == [bad]


def test_a_sparse_filter_reads_a_bounded_page_and_goes_on(client: ReachClient, settings: Settings,
                                                          r: Any) -> None:
    needle = client.submit("srchs", {"i": -1}, trace_id=NEEDLE).task_id
    client.submit_many("srchs", [{"i": i} for i in range(400)])
    page = search_tasks(r, settings, TaskQuery(capability="srchs", trace_id=NEEDLE), budget=150)
    assert page.tasks == [] and page.scanned == 150 and page.next_cursor is not None
    found, pages = _all_pages(r, settings, TaskQuery(capability="srchs", trace_id=NEEDLE), budget=150)
    assert found == [needle] and pages == 3
    # The library's follow-every-page answer (the CLI's) finds it in one call.
    assert _ids(find_tasks(r, settings, TaskQuery(capability="srchs", trace_id=NEEDLE))) == [needle]


def test_records_that_expired_are_skipped_and_pruning_drops_old_entries(
        client: ReachClient, make_settings: Any, r: Any) -> None:
    settings = make_settings()
    kept = client.submit("srchp", {"i": 1}).task_id
    gone = client.submit("srchp", {"i": 2}).task_id
    keys = CapabilityKeys(settings.prefix, "srchp")
    r.delete(keys.task(gone.split(":")[1]))
    assert _ids(search_tasks(r, settings, TaskQuery(capability="srchp"))) == [kept]
    assert prune_task_index(r, settings, "srchp") == 0
    assert prune_task_index(r, make_settings(result_ttl_ms=1), "srchp") == 2
    assert r.zcard(keys.tasks) == 0


def test_bad_queries_are_refused_with_a_reason(settings: Settings, r: Any) -> None:
    for query, words in [(TaskQuery(limit=0), "limit"), (TaskQuery(capability="Bad Name"), "capability"),
                         (TaskQuery(cursor="nonsense"), "cursor"), (TaskQuery(agent_id="x" * 300), "agent"),
                         (TaskQuery(since_ms=-5), "since")]:
        with pytest.raises(BadInput, match=words):
            search_tasks(r, settings, query)


def test_cursor_positions_order_like_the_walk() -> None:
    a = Position(1000, "alpha", "01B")
    assert decode_cursor(a.encode()) == a
    assert Position(1000, "alpha", "01A") < a < Position(1000, "beta", "01A") < Position(1001, "a", "0")


def test_reach_tasks_cli(client: ReachClient, settings: Settings) -> None:
    made = [client.submit("srchcli", {"i": i}).task_id for i in range(3)]
    env = settings_env(settings)
    out = subprocess.run([sys.executable, "-m", "reach_cli", "tasks", "--capability", "srchcli",
                          "--state", "queued", "--limit", "2", "--json"],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [row["task_id"] for row in rows] == [made[2], made[1]]
    assert "--cursor" in out.stderr
    bad = subprocess.run([sys.executable, "-m", "reach_cli", "tasks", "--state", "sleeping"],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown state 'sleeping'" in bad.stderr
