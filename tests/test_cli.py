"""The `reach` and `reach-worker` commands as a user runs them: output, exit codes, clean stops."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from broker import ReachClient, Settings
from tests.conftest import ROOT, Fleet, settings_env, wait_until

# (The CLI's parsing, output and exit codes are the same on every Redis.)
pytestmark = pytest.mark.one_redis

UNKNOWN = "echo:01KZZZZZZZZZZZZZZZZZZZZZZZ"


def reach(settings: Settings, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "reach_cli", *args], env=settings_env(settings),
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_usage_errors_exit_2_with_one_line(settings: Settings) -> None:
    cases = [
        (["submit", "echo", "{not json"], "payload is not valid JSON"),
        (["submit", "Echo", "{}"], "invalid capability name"),
        (["submit", "echo", "{}", "--priority", "12"], "priority must be an int from 0 to 9"),
        (["submit", "echo", "[NaN]"], "not valid JSON"),
        (["status", "not-an-id"], "invalid task id"),
        (["cancel", "x:y"], "invalid task id"),
        (["dispatcher", "--capability", "Summarize"], "invalid capability name"),
    ]
    # (The commands are independent: all nine run at once, each checked as it was.)
    with ThreadPoolExecutor(len(cases) + 2) as pool:
        runs = [pool.submit(reach, settings, *args) for args, _ in cases]
        bare = pool.submit(reach, settings, "submit")
        unknown = pool.submit(reach, settings, "--no-such-flag")
        for (args, message), run in zip(cases, runs, strict=True):
            done = run.result()
            assert done.returncode == 2, (args, done.stderr)
            lines = done.stderr.strip().splitlines()
            assert len(lines) == 1 and message in lines[0], (args, done.stderr)
        assert bare.result().returncode == 2
        assert unknown.result().returncode == 2


def test_worker_and_dispatcher_run_on_the_event_loop_chosen(settings: Settings, fleet: Fleet) -> None:
    # uvloop where it is installed (the default), asyncio's own loop when REACH_EVENT_LOOP says
    # so: tasks go through either way, and the start line says which loop it is.
    default = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    dispatcher = fleet.dispatcher(env={"REACH_EVENT_LOOP": "asyncio"})
    worker = fleet.worker("echo", env={"REACH_EVENT_LOOP": "auto"})  # (whatever the caller's is)
    with ReachClient(settings) as client:
        assert client.run("echo", {"n": 1}, timeout=30) == {"n": 1}
    assert "asyncio loop)" in dispatcher.output(), dispatcher.output()
    assert f"{default} loop)" in worker.output(), worker.output()
    env = {**settings_env(settings), "REACH_EVENT_LOOP": "libevent"}
    for argv in (["reach_cli", "dispatcher"], ["reach_cli.worker", "--capability", "echo"]):
        done = subprocess.run([sys.executable, "-m", *argv], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, (argv, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "REACH_EVENT_LOOP must be one of" in lines[0], done.stderr


def test_runtime_errors_exit_1(settings: Settings) -> None:
    for args in (["status", UNKNOWN], ["result", UNKNOWN], ["cancel", UNKNOWN]):
        done = reach(settings, *args)
        assert done.returncode == 1, (args, done.stderr)
        assert "unknown task id" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_submit_status_result_cancel_json(settings: Settings, fleet: Fleet) -> None:
    queued = json.loads(reach(settings, "submit", "echo", '{"a": 1}', "--priority", "7", "--json").stdout)
    status = json.loads(reach(settings, "status", queued["task_id"], "--json").stdout)
    assert list(status) == ["task_id", "capability", "state", "priority", "attempt", "agent_id",
                            "created_at", "finished_at", "reason", "error", "trace_id", "progress_dropped"]
    assert status["state"] == "queued" and status["priority"] == 7
    assert len(status["trace_id"]) == 32 and int(status["trace_id"], 16)  # (the W3C trace id)
    not_yet = reach(settings, "result", queued["task_id"], "--no-wait")
    assert not_yet.returncode == 1 and "has not finished" in not_yet.stderr
    canceled = json.loads(reach(settings, "cancel", queued["task_id"], "--json").stdout)
    assert canceled == {"task_id": queued["task_id"], "canceled": True, "state": "canceled"}

    fleet.dispatcher()
    fleet.worker("echo")
    done = reach(settings, "submit", "echo", '{"b": [1, 2]}', "--wait", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["state"] == "succeeded" and out["result"] == {"b": [1, 2]}
    plain = reach(settings, "submit", "echo", '"hi"')
    task_id = plain.stdout.strip()
    assert reach(settings, "result", task_id, "--timeout", "30").stdout.strip() == '"hi"'


def test_failed_task_exits_1_with_reason(settings: Settings, fleet: Fleet) -> None:
    fleet.dispatcher()
    fleet.worker("summarize")
    done = reach(settings, "submit", "summarize", '{"text": ""}', "--wait")
    assert done.returncode == 1
    assert "invalid_request" in done.stderr


def test_reach_worker_usage_errors(settings: Settings) -> None:
    def worker(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "reach_cli.worker", *args], env=settings_env(settings),
                              cwd=ROOT, capture_output=True, text=True, timeout=30)

    missing = worker("--capability", "nohandler")
    assert missing.returncode == 2 and "no handler for capability 'nohandler'" in missing.stderr
    bad = worker("--capability", "x", "--handler", "no.such.module:f")
    assert bad.returncode == 2 and "cannot import handler module" in bad.stderr
    bad_cap = worker("--capability", "Bad Name")
    assert bad_cap.returncode == 2 and "invalid capability name" in bad_cap.stderr
    assert worker().returncode == 2


def test_reach_worker_binds_handlers_per_capability(settings: Settings, fleet: Fleet,
                                                    client: ReachClient) -> None:
    fleet.dispatcher()
    fleet.worker("x=tests.handlers:record_sync", "summarize")
    assert client.run("x", {"n": 3}, timeout=30) == {"n": 3, "sync": True}
    assert "summary" in client.run("summarize", {"text": "One. Two."}, timeout=30)


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) counts as gone.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] != "Z"


def test_reach_up_runs_the_stack_and_ctrl_c_stops_everything(tmp_path: object) -> None:
    env = dict(os.environ)
    env.pop("REDIS_URL", None)
    env.pop("REACH_CONFIG", None)
    proc = subprocess.Popen([sys.executable, "-m", "reach_cli", "up", "--prefix", "uptest",
                             "--gateway-addr", "127.0.0.1:0"],
                            env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if "Ctrl-C stops everything" in line:
                break
        else:
            pytest.fail("reach up did not come up:\n" + "".join(lines))
        url = next(word for line in lines for word in line.split() if word.startswith("redis://"))
        children = _children(proc.pid)
        assert len(children) >= 5, "redis, a dispatcher, two workers and the gateway"
        with ReachClient(Settings.load(redis_url=url, prefix="uptest")) as client:
            result = client.run("summarize", {"text": "Stacks start. Stacks stop cleanly."}, timeout=30)
            assert result["sentence_count"] == 2
        gateway = next(word.rstrip(":") for line in lines if "gateway is up on" in line
                       for word in line.split() if word.startswith("http://"))
        reply = httpx.post(f"{gateway}/v1/tasks", timeout=30, json={
            "capability": "summarize", "payload": {"text": "Over HTTP. From any language."}})
        done = httpx.get(f"{gateway}/v1/tasks/{reply.json()['task_id']}/result", params={"wait": 30},
                         timeout=40).json()
        assert done["result"]["sentence_count"] == 2
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
        wait_until(lambda: not any(_alive(pid) for pid in children), timeout=10,
                   message="every child process gone")
    finally:
        if proc.poll() is None:
            proc.kill()


def test_reach_demo_exits_0(tmp_path: object) -> None:
    env = dict(os.environ)
    env.pop("REDIS_URL", None)
    done = subprocess.run([sys.executable, "-m", "reach_cli", "demo"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "demo finished" in done.stdout
    assert "invalid_request" in done.stdout
