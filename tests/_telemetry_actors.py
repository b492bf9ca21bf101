"""Actors for tests/test_telemetry.py (importable by procs)."""
from __future__ import annotations

import sys

from runtime import Actor, current_rank, endpoint, get_meter, span, traced


class Meters(Actor):
    """Records a counter and spans with Monarch's names."""

    @endpoint
    @traced
    def step(self, value: float) -> int:
        r = current_rank().rank
        get_meter("test").create_counter("steps").add(value, {"rank": r})
        with span("inner", correlation_id=7):
            pass
        return r

    @endpoint
    def otel_loaded(self) -> bool:
        return "opentelemetry" in sys.modules and sys.modules["opentelemetry"] is not None

    @endpoint
    def in_memory(self, value: float) -> dict:
        """Install an in-memory reader and exporter in this proc, record, read them back."""
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        from runtime import telemetry

        reader, spans = InMemoryMetricReader(), InMemorySpanExporter()
        assert telemetry.install([reader], [SimpleSpanProcessor(spans)])
        self.step_body(value)
        points = [(m.name, dp.value, dict(dp.attributes))
                  for rm in reader.get_metrics_data().resource_metrics
                  for sm in rm.scope_metrics for m in sm.metrics for dp in m.data.data_points]
        return {"points": points,
                "spans": sorted((s.name, dict(s.attributes)) for s in spans.get_finished_spans())}

    @traced("custom-name")
    def step_body(self, value: float) -> None:
        get_meter().create_counter("loss_sum").add(value, {"rank": current_rank().rank})


def block_opentelemetry() -> None:
    """A bootstrap: this proc behaves as if OpenTelemetry were not installed."""
    for name in ("opentelemetry", "opentelemetry.metrics", "opentelemetry.trace"):
        sys.modules[name] = None  # type: ignore[assignment]


class Recorder(Actor):
    """Records into instruments it is given (made in the controller, sent to the proc)."""

    @endpoint
    def record(self, counter, value: float) -> list:
        """Install an in-memory reader in this proc, add `value` to `counter`, read it back."""
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader

        from runtime import telemetry

        reader = InMemoryMetricReader()
        assert telemetry.install([reader])
        counter.add(value, {"rank": current_rank().rank})
        return [(m.name, dp.value, dict(dp.attributes))
                for rm in reader.get_metrics_data().resource_metrics
                for sm in rm.scope_metrics for m in sm.metrics for dp in m.data.data_points]
