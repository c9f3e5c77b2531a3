"""The W3C trace context's text (broker/protocol/trace.py), pure; and that Reach never loads
OpenTelemetry on its own."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import timeit

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.errors import BadInput
from broker.protocol.delivery import parse_entry
from broker.protocol.trace import (
    TraceContext,
    check_trace_id,
    check_traceparent,
    check_tracestate,
    given_trace,
    new_traceparent,
    parse_stored,
    trace_filter,
    trace_id_of,
)
from tests.conftest import ROOT

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
GIVEN = f"00-{TRACE}-00f067aa0ba902b7-01"


def test_a_new_traceparent_is_sampled_version_00_and_new_each_time() -> None:
    made = {new_traceparent() for _ in range(1000)}
    assert len(made) == 1000
    for tp in made:
        assert check_traceparent(tp) == tp and tp.endswith("-01") and len(tp) == 55
    assert len({tp[3:35] for tp in made}) == 1000
    in_trace = new_traceparent(TRACE)
    assert in_trace[3:35] == TRACE and in_trace != new_traceparent(TRACE)


def test_making_one_is_cheap() -> None:
    # (submit is a hot path: one getrandbits and one format, a few microseconds at most)
    seconds = min(timeit.repeat(new_traceparent, number=10_000, repeat=3)) / 10_000
    assert seconds < 20e-6, f"{seconds * 1e6:.1f} µs a traceparent"


@pytest.mark.parametrize(("value", "message"), [
    ("", "must be a W3C traceparent"),
    ("00-xyz", "must be a W3C traceparent"),
    (GIVEN.upper(), "must be a W3C traceparent"),
    (GIVEN.replace("-", "_"), "must be a W3C traceparent"),
    (f"00-{TRACE}-00f067aa0ba902b7-1", "must be a W3C traceparent"),
    (f"ff-{TRACE}-00f067aa0ba902b7-01", "version ff"),
    (GIVEN + "-00", "version 00 must be 55 characters"),
    (GIVEN + " ", "version 00 must be 55 characters"),
    (f"01-{TRACE}-00f067aa0ba902b7-01x", "trailing characters"),
    (f"00-{'0' * 32}-00f067aa0ba902b7-01", "all-zero trace id"),
    (f"00-{TRACE}-{'0' * 16}-01", "all-zero parent id"),
    (None, "must be a string"),
    (b"00", "must be a string"),
])
def test_a_bad_traceparent_is_refused_naming_the_field(value: object, message: str) -> None:
    with pytest.raises(BadInput, match=message) as caught:
        check_traceparent(value)
    assert str(caught.value).startswith("traceparent")
    assert isinstance(caught.value, ValueError)


def test_a_later_version_is_read_as_version_00() -> None:
    assert check_traceparent(f"01-{TRACE}-00f067aa0ba902b7-03-more") == f"00-{TRACE}-00f067aa0ba902b7-03"
    assert check_traceparent(f"cc-{TRACE}-00f067aa0ba902b7-00") == f"00-{TRACE}-00f067aa0ba902b7-00"


def test_tracestate_is_checked_member_by_member() -> None:
    assert check_tracestate("rojo=00f067aa0ba902b7, congo=t61rcWkgMzE,,") == \
        "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
    assert check_tracestate("tenant@vendor=a b") == "tenant@vendor=a b"
    for bad, message in [("Rojo=1", "is not key=value"), ("a=", "is not key=value"),
                         ("a=1=2", "is not key=value"), ("a=1,a=2", "names 'a' twice"),
                         (",".join(f"k{i}=v" for i in range(33)), "more than 32 members"),
                         ("a=" + "x" * 600, "longer than 512"), (7, "must be a string")]:
        with pytest.raises(BadInput, match=message):
            check_tracestate(bad)


def test_what_a_producer_passes() -> None:
    assert given_trace(None, None, None) is None
    assert given_trace(GIVEN, None, None) == TraceContext(GIVEN)
    assert given_trace(GIVEN, " a=1 ", TRACE) == TraceContext(GIVEN, "a=1")
    from_id = given_trace(None, None, TRACE)
    assert from_id is not None and from_id.trace_id == TRACE
    padded = given_trace(None, None, "0123456789abcdef")
    assert padded is not None and padded.trace_id == "0" * 16 + "0123456789abcdef"
    with pytest.raises(BadInput, match="tracestate needs a traceparent"):
        given_trace(None, "a=1", None)
    with pytest.raises(BadInput, match="different traces"):
        given_trace(GIVEN, None, "1" * 32)
    for bad in ("trace-1", TRACE.upper(), "0" * 32, "abc"):
        with pytest.raises(BadInput, match="trace_id"):
            check_trace_id(bad)


def test_the_stored_form_and_what_is_read_back() -> None:
    plain, with_state = TraceContext(GIVEN), TraceContext(GIVEN, "a=1,b=2 c")
    assert plain.stored() == GIVEN and with_state.stored() == f"{GIVEN} a=1,b=2 c"
    assert parse_stored(plain.stored()) == plain and parse_stored(with_state.stored()) == with_state
    assert (plain.trace_id, plain.span_id) == (TRACE, "00f067aa0ba902b7")
    assert trace_id_of(with_state.stored()) == TRACE
    for nothing in (None, "", "0123456789abcdef", "garbage"):
        assert parse_stored(nothing) is None and trace_id_of(nothing) is None
    assert trace_filter(GIVEN, "trace") == TRACE and trace_filter(TRACE, "trace") == TRACE
    with pytest.raises(BadInput, match=r"^trace must be"):
        trace_filter("needle", "trace")


@given(st.integers(1, 2**128 - 1), st.integers(1, 2**64 - 1), st.integers(0, 255),
       st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7e, exclude_characters=",="),
               min_size=1, max_size=20))
def test_any_valid_context_survives_the_record(trace: int, span: int, flags: int, value: str) -> None:
    tp = f"00-{trace:032x}-{span:016x}-{flags:02x}"
    context = given_trace(tp, f"k={value}", None)
    assert context is not None and parse_stored(context.stored()) == context
    assert trace_id_of(context.stored()) == f"{trace:032x}"


def test_an_inbox_entry_carries_the_stored_trace_to_the_agent() -> None:
    stored = f"{GIVEN} a=1"
    entry = parse_entry("cap", "1700000000000-0", {
        "id": "01JABCDEFGHJKMNPQRSTVWXYZ0", "fence": "3", "p": "{}",
        "x": f"2|60000|0|3|{stored}|conv|{{}}"})
    assert entry is not None and entry.trace_context() == TraceContext(GIVEN, "a=1")
    bare = parse_entry("cap", "1700000000000-0", {
        "id": "01JABCDEFGHJKMNPQRSTVWXYZ0", "fence": "1", "p": "{}", "x": "1|60000|0|3||conv|{}"})
    assert bare is not None and len(bare.trace_context().traceparent) == 55  # (a corrupt record)


PACKAGES = ("broker", "agent_worker", "dispatcher", "dlq_tools", "reach_cli", "gateway")


def test_no_module_of_reach_imports_opentelemetry_at_import_time() -> None:
    # (only inside the functions that run once a process uses it: broker/infra/otel.py,
    # agent_worker/tracing.py, broker/client/tracing.py)
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.parse(path.read_text()).body:
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                assert not any(n.split(".")[0] == "opentelemetry" for n in names), path


@pytest.mark.parametrize("setup", [
    "",
    "import broker.client.sync, agent_worker.attempts, agent_worker.tracing, gateway.api.tasks",
])
def test_importing_reach_loads_no_opentelemetry_of_its_own(setup: str) -> None:
    # (redis-py 8 and FastAPI load OpenTelemetry's API themselves when it is installed: what
    # they load is the baseline; Reach must load nothing more, and set up no tracer provider.)
    code = ("import sys\nimport redis, fastapi, fastapi.applications, httpx, uvicorn\n"
            "before = {m for m in sys.modules if m.startswith('opentelemetry')}\n"
            f"import broker, agent_worker, dispatcher, dlq_tools\n{setup}\n"
            "from broker.protocol.submit import build_submit_request\n"
            "from broker.settings import Settings\n"
            "build_submit_request(Settings(), 'cap', {}, None)\n"
            "loaded = sorted(m for m in sys.modules if m.startswith('opentelemetry') and m not in before)\n"
            "assert not loaded, loaded\n"
            "t = sys.modules.get('opentelemetry.trace')\n"
            "assert t is None or isinstance(t.get_tracer_provider(), t.ProxyTracerProvider)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
