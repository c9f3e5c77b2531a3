"""The floors pyproject.toml declares are the versions CI's minimum-versions step installs."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENT = re.compile(r"^(?P<name>[A-Za-z0-9_.-]+)(\[[^\]]*\])?>=(?P<floor>[0-9][0-9.]*)\s*(;.*)?$")


def declared_floors() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    floors = {}
    extras = project["optional-dependencies"]
    for requirement in [*project["dependencies"], *extras["test"], *extras["a2a"], *extras["mcp"],
                        *extras["otel"]]:
        match = REQUIREMENT.match(requirement)
        assert match, f"{requirement!r} declares no floor (name>=version)"
        floors[match["name"].lower()] = match["floor"]
    return floors


def pinned() -> dict[str, str]:
    pins = {}
    for line in (ROOT / ".ci" / "min-versions.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[name.lower()] = version
    return pins


def test_every_declared_floor_is_the_version_the_minimum_step_installs() -> None:
    pins = pinned()
    for name, floor in declared_floors().items():
        assert name in pins, f"{name} is not in .ci/min-versions.txt"
        assert _release(pins[name]) == _release(floor), (
            f"{name}: pyproject.toml says >={floor}, .ci/min-versions.txt installs {pins[name]}")


def _release(version: str) -> tuple[int, ...]:
    parts = tuple(int(part) for part in version.split("."))
    while parts and parts[-1] == 0:
        parts = parts[:-1]
    return parts
