"""A skewed wall clock for the Python processes of a test (imported at interpreter start).

A test puts this folder first on PYTHONPATH and sets TEST_CLOCK_SKEW_S (seconds, may be negative
or fractional): `time.time()` and `time.time_ns()` then run that far ahead of (or behind) the
host's real clock, as on a host whose clock drifted. Monotonic clocks are left alone, as they are
on a real host with a wrong wall clock. Without the variable nothing changes.
"""

from __future__ import annotations

import os
import time

_SKEW_S = float(os.environ.get("TEST_CLOCK_SKEW_S") or 0)

if _SKEW_S:
    _real_time = time.time
    _real_time_ns = time.time_ns
    _skew_ns = round(_SKEW_S * 1_000_000_000)

    def _skewed_time() -> float:
        return _real_time() + _SKEW_S

    def _skewed_time_ns() -> int:
        return _real_time_ns() + _skew_ns

    time.time = _skewed_time
    time.time_ns = _skewed_time_ns
