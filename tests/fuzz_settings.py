"""How many examples the property-based tests draw: a bounded number in CI, far more with
HYPOTHESIS_PROFILE=long (see docs/security.md, "Limits").

    bounded(n)   n examples (n * LONG_FACTOR with the long profile), no deadline (a loaded CI
                 machine is slow), no health check about slow data generation
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

from hypothesis import HealthCheck, settings

LONG_FACTOR = 50
LONG = os.environ.get("HYPOTHESIS_PROFILE", "") == "long"
F = TypeVar("F", bound=Callable[..., Any])


def bounded(n: int) -> Callable[[F], F]:
    """The settings of a property-based test that draws about `n` examples in CI."""
    chosen = settings(max_examples=n * LONG_FACTOR if LONG else n, deadline=None,
                      suppress_health_check=list(HealthCheck), derandomize=not LONG)

    def apply(test: F) -> F:
        return chosen(test)

    return apply
