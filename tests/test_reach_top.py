"""`reach top` in a real terminal: tmux runs it (a private tmux server per test), send-keys types,
capture-pane reads the screen. It shows capabilities, agents and task events, filters by
capability, pauses the feed, and quits on q or Ctrl-C with the terminal restored."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker import ReachClient
from broker.settings import Settings
from tests.conftest import ROOT, Fleet, settings_env, wait_until

pytestmark = pytest.mark.one_redis


class Terminal:
    def __init__(self, settings: Settings, socket: Path) -> None:
        self.socket = str(socket)
        self.env = settings_env(settings)
        self.env["TERM"] = "xterm-256color"

    def tmux(self, *args: str) -> str:
        done = subprocess.run(["tmux", "-S", self.socket, *args], env=self.env, capture_output=True,
                              text=True, timeout=10)
        return done.stdout

    def start(self, command: str) -> None:
        # (after the command: its exit status and whether the terminal is back in canonical mode)
        script = f"{command}; echo EXIT=$?; stty -a | tr ' ' '\\n' | grep -x -- '-*icanon'; sleep 60"
        self.tmux("new-session", "-d", "-s", "top", "-x", "160", "-y", "45", "sh", "-c", script)
        self.tmux("resize-window", "-t", "top", "-x", "160", "-y", "45")  # (some tmux keep 80x24)

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p")

    def wait_for(self, text: str, timeout: float = 40) -> str:
        try:
            return str(wait_until(lambda: text in (s := self.screen()) and s, timeout,
                                  message=f"{text!r} on the screen"))
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the screen:\n{self.screen()}") from None

    def keys(self, *keys: str, literal: bool = False) -> None:
        self.tmux("send-keys", *(["-l"] if literal else []), *keys)

    def close(self) -> None:
        self.tmux("kill-server")


@pytest.fixture
def terminal(settings: Settings) -> Iterator[Terminal]:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (apt-get install tmux)")
    # (a server of its own, its socket in a directory of its own: short enough for a socket path)
    home = Path(tempfile.mkdtemp(prefix="reach-tmux-"))
    t = Terminal(settings, home / "s")
    yield t
    t.close()
    shutil.rmtree(home, ignore_errors=True)


def _top(*args: str) -> str:
    return " ".join(shlex.quote(a) for a in [sys.executable, "-m", "reach_cli", "top", *args])


def test_top_shows_the_fleet_filters_pauses_and_quits(fleet: Fleet, client: ReachClient,
                                                     terminal: Terminal) -> None:
    fleet.dispatcher()
    fleet.worker("topwork", handler="tests.gateway_handlers:work", agent_id="top-agent")
    first = client.submit("topwork", {"x": 1}).task_id
    client.submit("topother", {"x": 2})
    terminal.start(f"cd {shlex.quote(str(ROOT))} && {_top('--refresh', '0.3')}")
    screen = terminal.wait_for(first)
    for text in ("topwork", "topother", "top-agent", "healthy", "succeeded"):
        assert text in screen

    terminal.keys("p")
    terminal.wait_for("FEED PAUSED")
    held = client.submit("topwork", {"x": 3}).task_id
    terminal.wait_for("FEED PAUSED (")
    wait_until(lambda: "(0 waiting)" not in terminal.screen(), message="the held events counted")
    assert held not in terminal.screen()
    terminal.keys("p")
    terminal.wait_for(held)

    terminal.keys("f")
    # (keys typed before the box has focus go to the app: the "p" in "topother" would pause)
    terminal.wait_for("capability to show")
    terminal.keys("topother", literal=True)
    terminal.keys("Enter")
    terminal.wait_for("capability: topother")

    def tables() -> tuple[str, str]:
        """(the capabilities table, the agents table): the feed below may name any agent."""
        screen = terminal.screen()
        above, _, below = screen.partition("\n Agents")
        return above, below.split("────")[0]

    wait_until(lambda: "top-agent" not in tables()[1], message="the other capability's agent hidden")
    assert "topwork " not in tables()[0] and "topother" in tables()[0]

    terminal.keys("q")
    terminal.wait_for("EXIT=0")
    screen = terminal.wait_for("icanon")  # (stty's word for canonical mode: -icanon while raw)
    assert "\nicanon" in screen and "-icanon" not in screen  # (the terminal is restored)


def test_top_quits_on_ctrl_c(terminal: Terminal, client: ReachClient) -> None:
    client.submit("topctrl", {"x": 1})
    terminal.start(_top())
    terminal.wait_for("topctrl")
    terminal.keys("C-c")
    terminal.wait_for("EXIT=0")
    screen = terminal.wait_for("icanon")
    assert "\nicanon" in screen and "-icanon" not in screen


def test_top_refuses_a_bad_capability(settings: Settings) -> None:
    done = subprocess.run([sys.executable, "-m", "reach_cli", "top", "--capability", "Not Valid"],
                          env=settings_env(settings), cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "capability" in done.stderr
