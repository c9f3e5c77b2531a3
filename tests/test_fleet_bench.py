"""The fleet benchmark's harness (bench/fleet/): its arithmetic, and a smoke run of Reach alone.

The smoke run is no timed test (its figures are not checked against targets): it proves that
the harness still drives real reach-worker and dispatcher processes through a scenario and counts
what they did, so the benchmark does not rot between full runs.
"""

from __future__ import annotations

import importlib.util
import json
import math

from bench.fleet import metrics
from bench.fleet.cli import main
from bench.fleet.scenarios import Timings, all_scenarios
from bench.fleet.workload import Workload
from bench.stats import percentile


def test_the_workload_is_seeded_lognormal_at_seventy_percent_of_capacity():
    w = Workload()
    durations = w.durations()
    assert durations == Workload().durations()  # every system runs the same tasks
    assert 35 <= percentile(durations, 50) <= 45
    assert 330 <= percentile(durations, 99) <= 480
    assert w.rate == 0.7 * w.capacity
    assert math.isclose(w.capacity, 8 * 4 * 1000 / w.mean_ms)


def test_executions_pair_up_and_count_attempts_duplicates_and_touches(tmp_path):
    (tmp_path / "exec-a1.log").write_text(
        "S 0 a1 1000.0\nE 0 a1 1000.0 1010.0 fail\n"   # the bad agent fails task 0
        "S 1 a1 2000.0\n")                            # and is killed while running task 1
    (tmp_path / "exec-a2.log").write_text(
        "S 0 a2 1500.0\nE 0 a2 1500.0 1540.0 ok\n"
        "S 1 a2 9000.0\nE 1 a2 9000.0 9050.0 ok\n"
        "S 2 a2 100.0\nE 2 a2 100.0 140.0 ok\nS 2 a2 200.0\nE 2 a2 200.0 240.0 ok\n")
    runs = metrics.read_executions(tmp_path)
    assert len(runs) == 6 and sum(1 for r in runs if r.end is None) == 1
    assert metrics.twice_ok(runs) == {2: 2}
    rows = [[0, "t0", 900.0, 1600.0, "ok"], [1, "t1", 1900.0, 9100.0, "ok"], [2, "t2", 50.0, None, None]]
    summary = metrics.summarise(rows, runs, refused={}, windows=[("a1", 1900.0, math.inf)])
    assert summary["completed"] == 2 and summary["unfinished"] == 1
    assert summary["twice_to_effect"] == 1
    assert summary["attempts"] == {"2": 3}
    assert summary["touched_bad"] == 1  # task 1 was running on a1 when it died; task 0 was earlier
    assert summary["max_ms"] is None  # a task never seen is infinitely late
    refused = metrics.summarise(rows, runs, refused={2: 1}, windows=[])
    assert refused["twice_to_effect"] == 0 and refused["refused_late_results"] == 1


def test_a_percentile_over_unfinished_tasks_is_infinite_only_when_it_reaches_them():
    values = [10.0] * 98 + [math.inf] * 2
    assert metrics.percentile(values, 50) == 10.0
    assert math.isinf(metrics.percentile(values, 99))


def test_each_scenario_names_its_bad_agents_windows_from_what_happened():
    scenarios = {s.key: s for s in all_scenarios(Timings())}
    marks = {"kill:a1": 5000.0, "stop:a2": 7000.0, "cont:a2": 27000.0}
    assert scenarios["dying"].windows(marks, {}, Timings()) == [
        ("a1", 5000.0, math.inf), ("a2", 7000.0, 27000.0)]
    assert scenarios["cold"].windows({}, {"a8": 100.0}, Timings()) == [("a8", 100.0, 5100.0)]
    assert scenarios["blackhole"].control("a1", Timings())["fail"] is True
    assert scenarios["healthy"].windows({}, {}, Timings()) == []


def test_a_smoke_run_drives_reach_through_a_black_hole_and_counts_it(tmp_path):
    # (One scenario keeps it to seconds; with 120 tasks a1 takes a few before its circuit opens.)
    n = 120
    code = main(["--smoke", "--only", "reach", "--scenarios", "blackhole", "--n", str(n),
                 "--out", str(tmp_path)])
    assert code == 0
    (path,) = [p for p in tmp_path.glob("fleet-*.json") if not p.name.endswith("-series.json")]
    result = json.loads(path.read_text())
    hole = result["results"]["blackhole"]["reach"]["summary"]
    assert (hole["completed"], hole["failed"], hole["unfinished"], hole["twice_to_effect"]) == (n, 0, 0, 0)
    # Every task the black hole took failed there and ran once more elsewhere; no other task
    # ran more than once.
    assert 0 < hole["executions_on"]["a1"] == hole["touched_bad"]
    assert hole["attempts"] == {"1": n - hole["touched_bad"], "2": hole["touched_bad"]}
    assert set(result["bar"]["reach"]) == {"blackhole"}
    if importlib.util.find_spec("matplotlib") is not None:  # (the plot needs the bench extra)
        assert (tmp_path / f"{path.stem}-blackhole.png").stat().st_size > 10_000
