"""Version constraints for routing: `2.3` (at least 2.3), `>=2.3,<3`, `==2.4.1`, `!=2.5`, `~=2.3`.

Versions compare numerically part by part (`2.10` > `2.9`); a non-numeric part compares as
text after numbers (`2.3rc1` sorts between 2.3 and 2.4 only by its numeric prefix: [2, 3]
then 'rc1'). Pure functions, used to validate a task's constraint at submit and to filter
agents in the dispatcher.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache

from broker.errors import BadInput

_CLAUSE = re.compile(r"^\s*(>=|<=|==|!=|~=|>|<)?\s*([0-9A-Za-z][0-9A-Za-z.+-]*)\s*$")
Key = tuple[tuple[int, str], ...]


def version_key(version: str) -> Key:
    parts = []
    for piece in re.split(r"[.+-]", version.strip()):
        match = re.match(r"^(\d+)(.*)$", piece)
        if match:
            parts.append((int(match.group(1)), match.group(2)))
        else:
            parts.append((-1, piece))
    while len(parts) > 1 and parts[-1] == (0, ""):
        parts.pop()
    return tuple(parts)


def _compatible(bound: Key) -> Callable[[Key], bool]:
    # ~=2.3 means >=2.3 and ==2.*; ~=2.3.1 means >=2.3.1 and ==2.3.*
    prefix = bound[:-1] if len(bound) > 1 else bound
    return lambda v: v >= bound and v[: len(prefix)] == prefix


@lru_cache(maxsize=1024)
def parse_spec(spec: str) -> Callable[[str], bool]:
    """A predicate for a constraint (BadInput if it cannot be read). A bare version is a minimum."""
    tests: list[tuple[str, Key]] = []
    for clause in spec.split(","):
        match = _CLAUSE.match(clause)
        if not match:
            raise BadInput(f"invalid version constraint {spec!r}: use e.g. '2.3', '>=2.3,<3'")
        tests.append((match.group(1) or ">=", version_key(match.group(2))))

    def check(version: str) -> bool:
        v = version_key(version)
        return all(_OPS[op](v, bound) for op, bound in tests)

    return check


def _compatible_with(v: Key, bound: Key) -> bool:
    return _compatible(bound)(v)


_OPS: dict[str, Callable[[Key, Key], bool]] = {
    ">=": lambda v, b: v >= b, "<=": lambda v, b: v <= b, ">": lambda v, b: v > b,
    "<": lambda v, b: v < b, "==": lambda v, b: v == b, "!=": lambda v, b: v != b,
    "~=": _compatible_with,
}


def satisfies(version: str | None, spec: str) -> bool:
    """Whether an agent's version meets a constraint (an agent without a version never does)."""
    return bool(version) and parse_spec(spec)(version or "")
