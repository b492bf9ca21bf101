"""get_meter, span and traced (runtime/telemetry.py): no-ops without OpenTelemetry, an
in-memory SDK reader in a proc, and OTLP/HTTP export to a receiver started here, flushed
by a proc stopped right after it recorded."""
from __future__ import annotations

import http.server
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import runtime
from tests._telemetry_actors import Meters, Recorder, block_opentelemetry

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parent.parent


def test_import_runtime_does_not_need_opentelemetry():
    code = textwrap.dedent("""
        import sys
        sys.modules["opentelemetry"] = None  # as if it were not installed
        import runtime
        c = runtime.get_meter("x").create_counter("c")
        c.add(1.5, {"rank": 0})
        runtime.get_meter().create_histogram("h").record(2)
        with runtime.span("s", correlation_id=1):
            pass
        @runtime.traced
        def f(x):
            return x + 1
        @runtime.traced("named")
        async def g():
            return 5
        import asyncio
        assert f(1) == 2 and asyncio.run(g()) == 5 and f.__name__ == "f"
        assert runtime.telemetry.flush() and runtime.telemetry.shutdown()
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
    r = subprocess.run([sys.executable, "-c", "import sys, runtime; "
                        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "[]", r.stdout + r.stderr[-2000:]


def test_procs_without_opentelemetry_run_the_same_code():
    pm = runtime.this_host().spawn_procs(per_host={"procs": 2}, bootstrap=block_opentelemetry)
    try:
        m = pm.spawn("m", Meters)
        assert list(m.step.call(1.5).get(timeout=60).values()) == [0, 1]
        assert list(m.otel_loaded.call().get(timeout=30).values()) == [False, False]
    finally:
        pm.stop().get(timeout=30)


def test_an_in_memory_reader_in_a_proc_gets_typed_values():
    pytest.importorskip("opentelemetry.sdk", reason="opentelemetry-sdk is not installed")
    pm = runtime.this_host().spawn_procs(per_host={"procs": 2})
    try:
        got = pm.spawn("m", Meters).in_memory.call(1.5).get(timeout=60)
        for rank, r in enumerate(got.values()):
            assert r["points"] == [("loss_sum", 1.5, {"rank": rank})]
            assert isinstance(r["points"][0][1], float)
            ((name, attrs),) = r["spans"]
            assert name == "custom-name" and attrs["rank"] == rank
            assert attrs["actor_name"] == "m" and attrs["actor_id"]
    finally:
        pm.stop().get(timeout=30)


def test_a_counter_made_in_the_controller_records_in_the_proc_it_is_sent_to():
    """docs/runtime.md's `steps = get_meter("train").create_counter("steps")` in a notebook
    cell, used by actors: the pickled counter is the proc's own counter of that name."""
    pytest.importorskip("opentelemetry.sdk", reason="opentelemetry-sdk is not installed")
    steps = runtime.get_meter("train").create_counter("steps")
    pm = runtime.this_host().spawn_procs(per_host={"procs": 2})
    try:
        got = pm.spawn("rec", Recorder).record.call(steps, 2.5).get(timeout=60)
        assert [r for r in got.values()] == [[("steps", 2.5, {"rank": 0})],
                                             [("steps", 2.5, {"rank": 1})]]
    finally:
        pm.stop().get(timeout=30)


class _Receiver(http.server.ThreadingHTTPServer):
    """An OTLP/HTTP (protobuf) receiver: decoded requests per path."""

    def __init__(self) -> None:
        self.got: dict[str, list] = {"/v1/metrics": [], "/v1/traces": []}
        self.cond = threading.Condition()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
                from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

                body = self.rfile.read(int(self.headers["Content-Length"]))
                kind = {"/v1/metrics": metrics_service_pb2.ExportMetricsServiceRequest,
                        "/v1/traces": trace_service_pb2.ExportTraceServiceRequest}[self.path]
                msg = kind()
                msg.ParseFromString(body)
                with receiver.cond:
                    receiver.got[self.path].append(msg)
                    receiver.cond.notify_all()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)

    def points(self) -> list:
        return [(m.name, dp.as_double, {a.key: a.value.int_value for a in dp.attributes})
                for req in self.got["/v1/metrics"] for rm in req.resource_metrics
                for sm in rm.scope_metrics for m in sm.metrics for dp in m.sum.data_points]

    def spans(self) -> list:
        return [s.name for req in self.got["/v1/traces"] for rs in req.resource_spans
                for ss in rs.scope_spans for s in ss.spans]


def test_otlp_export_from_procs_stopped_right_after():
    pytest.importorskip("opentelemetry.sdk", reason="opentelemetry-sdk is not installed")
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http",
                        reason="opentelemetry-exporter-otlp-proto-http is not installed")
    rx = _Receiver()
    t = threading.Thread(target=rx.serve_forever, daemon=True)
    t.start()
    try:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{rx.server_address[1]}",
               "OTEL_METRIC_EXPORT_INTERVAL": "3600000",  # only the flush at stop exports
               "OTEL_BSP_SCHEDULE_DELAY": "3600000"}
        pm = runtime.this_host().spawn_procs(per_host={"procs": 2}, env=env)
        m = pm.spawn("m", Meters)
        assert list(m.step.call(1.5).get(timeout=60).values()) == [0, 1]
        pm.stop().get(timeout=30)  # right after: nothing was exported before the stop
        deadline = time.monotonic() + 20
        with rx.cond:
            while len(rx.points()) < 2 and time.monotonic() < deadline:
                rx.cond.wait(0.5)
        assert sorted(rx.points(), key=lambda p: p[2]["rank"]) == [
            ("steps", 1.5, {"rank": 0}), ("steps", 1.5, {"rank": 1})]
        assert sorted(rx.spans()) == sorted(["Meters.step", "inner"] * 2)
    finally:
        rx.shutdown()
        rx.server_close()
