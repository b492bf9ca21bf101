"""Metrics and spans: Monarch's `get_meter`, `span` and `traced`, on the OpenTelemetry API.

- Without `opentelemetry-api` installed, every call is a no-op (`import runtime` never
  imports OpenTelemetry); with the API but no SDK, OpenTelemetry's own no-op providers apply.
- With `opentelemetry-sdk` and `opentelemetry-exporter-otlp-proto-http` installed and
  `OTEL_EXPORTER_OTLP_ENDPOINT` set, each proc installs a MeterProvider and a
  TracerProvider exporting over OTLP/HTTP: after it is forked (`start_in_proc`, from
  `proc.main`; never in the host agent or the zygote, whose threads a fork would not copy),
  and the controller on its first `get_meter`/`span`. OpenTelemetry's own variables
  (`OTEL_METRIC_EXPORT_INTERVAL`, `OTEL_EXPORTER_OTLP_HEADERS`, ...) apply.
- Procs end with `os._exit`, which skips `atexit`: a proc that stops flushes and shuts its
  providers down explicitly (`shutdown`, bounded), so what it recorded last is exported.
- `install(metric_readers=..., span_processors=...)` installs SDK providers with readers of
  your own (an `InMemoryMetricReader` in a test, a Prometheus reader, ...).

Values keep their type (a counter's `add(1.5)` records 1.5; Monarch's Rust meter records
`int(1.5)`), and attributes keep theirs. Layer 1 (basics).
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import threading
from typing import Any, Callable, Iterable, Optional

from . import timeline
from ._base.context import get_context

__all__ = [
    "ENDPOINT_ENV", "install", "start", "start_in_proc", "flush", "shutdown", "get_meter",
    "Meter", "Instrument", "span", "traced",
]

ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
log = logging.getLogger("runtime.telemetry")
_lock = threading.Lock()
_installed: dict[str, Any] = {}  # pid, meter_provider, tracer_provider of this process
_resource: dict[str, Any] = {}  # attributes of this process (proc id, mesh, rank)


_found: list = []  # the API's (metrics, trace) modules, or None, once looked for


def _api() -> Optional[tuple[Any, Any]]:
    if _found:
        return _found[0]
    try:
        from opentelemetry import metrics, trace
    except ImportError:
        _found.append(None)
        return None
    _found.append((metrics, trace))
    return metrics, trace


class _NoOp:
    """Stands for a meter, an instrument or a span when OpenTelemetry is not installed."""

    def __getattr__(self, name: str) -> Callable[..., Any]:
        return self._call

    def _call(self, *args: Any, **kwargs: Any) -> "_NoOp":
        return self

    def __enter__(self) -> "_NoOp":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


_NOOP = _NoOp()


def install(metric_readers: Iterable[Any] = (), span_processors: Iterable[Any] = (),
            resource_attributes: Optional[dict[str, Any]] = None) -> bool:
    """Make SDK providers with these metric readers and span processors this process's
    global ones (once per process: OpenTelemetry refuses to replace them); False if the
    SDK is not installed or providers were installed here already."""
    try:
        from opentelemetry import metrics, trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
    except ImportError:
        return False
    with _lock:
        if _installed.get("pid") == os.getpid():
            return False
        resource = Resource.create({"service.name": "monarch", **_resource,
                                    **(resource_attributes or {})})
        mp = MeterProvider(metric_readers=list(metric_readers), resource=resource,
                           shutdown_on_exit=False)
        tp = TracerProvider(resource=resource, shutdown_on_exit=False)
        for p in span_processors:
            tp.add_span_processor(p)
        metrics.set_meter_provider(mp)
        trace.set_tracer_provider(tp)
        _installed.update(pid=os.getpid(), meter_provider=mp, tracer_provider=tp)
    return True


def start() -> bool:
    """Export over OTLP/HTTP from this process when `OTEL_EXPORTER_OTLP_ENDPOINT` is set and
    the SDK and exporter are installed (else False, with one log line saying what is
    missing when the endpoint is set)."""
    if not os.environ.get(ENDPOINT_ENV) or _installed.get("pid") == os.getpid():
        return False
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as e:
        log.warning("%s is set but %s is missing: install opentelemetry-sdk and "
                    "opentelemetry-exporter-otlp-proto-http (pip install "
                    "'monarch-notebook[telemetry]'); nothing is exported", ENDPOINT_ENV, e.name)
        return False
    return install([PeriodicExportingMetricReader(OTLPMetricExporter())],
                   [BatchSpanProcessor(OTLPSpanExporter())])


def start_in_proc(proc_id: str, mesh: str, rank: int) -> bool:
    """In a proc just forked: name the proc in the exported resource, then `start()`."""
    _resource.update({"monarch.proc": proc_id, "monarch.mesh": mesh, "monarch.rank": rank})
    return start()


def flush(timeout: float = 5.0) -> bool:
    """Export what this process recorded so far (True if every provider finished within
    `timeout` seconds, or none was installed here)."""
    if _installed.get("pid") != os.getpid():
        return True
    ms = max(1, int(timeout * 1000))
    ok = True
    for key in ("meter_provider", "tracer_provider"):
        try:
            ok = bool(_installed[key].force_flush(ms)) and ok
        except Exception:  # noqa: BLE001 - an exporter's failure must not stop the proc
            log.exception("telemetry flush failed")
            ok = False
    return ok


def shutdown(timeout: float = 5.0) -> bool:
    """Export what is left and stop the providers installed here (their export threads
    end), within about `timeout` seconds: what a proc does when it stops, since `os._exit`
    skips OpenTelemetry's atexit handler. Metrics are exported once (by the meter
    provider's shutdown), spans by a flush first."""
    if _installed.get("pid") != os.getpid():
        return True
    ms = max(1, int(timeout * 1000))
    mp, tp = _installed["meter_provider"], _installed["tracer_provider"]
    _installed.clear()
    results: list[bool] = []

    def run() -> None:
        ok = True
        for step in (lambda: tp.force_flush(ms), lambda: mp.shutdown(timeout_millis=ms),
                     tp.shutdown):
            try:
                ok = step() is not False and ok
            except Exception:  # noqa: BLE001 - an exporter's failure must not stop the proc
                log.exception("telemetry shutdown failed")
                ok = False
        results.append(ok)

    t = threading.Thread(target=run, name="telemetry-shutdown", daemon=True)
    t.start()
    t.join(timeout * 2)
    return bool(results and results[0])


def get_meter(name: str = "monarch", version: Optional[str] = None,
              schema_url: Optional[str] = None,
              attributes: Optional[dict[str, Any]] = None) -> Any:
    """An OpenTelemetry `Meter` (`create_counter`, `create_histogram`, ...) from this
    process's MeterProvider; a no-op one without OpenTelemetry (Monarch's `get_meter`).
    It and its instruments pickle by name: one sent to a proc records in that proc."""
    api = _api()
    if api is None:
        return _NOOP
    start()
    key = (name, version, schema_url, attributes)
    return Meter(key, api[0].get_meter(name, version, schema_url, attributes))


class Meter:
    """An OpenTelemetry meter, pickled by name: a meter or instrument made in the controller
    (a notebook cell) and used in an actor records in the actor's process, through that
    process's MeterProvider (pickled by value, its copy would record nowhere)."""

    def __init__(self, key: tuple, inner: Any) -> None:
        self._key, self._inner = key, inner

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not name.startswith("create_") or not callable(attr):
            return attr

        def create(*args: Any, **kwargs: Any) -> Instrument:
            return Instrument(self._key, name, args, kwargs, attr(*args, **kwargs))

        return create

    def __reduce__(self) -> Any:
        return (get_meter, self._key)

    def __repr__(self) -> str:
        return f"<Meter {self._key[0]!r}: {self._inner!r}>"


class Instrument:
    """An OpenTelemetry instrument (counter, histogram, ...) that pickles by name: unpickled
    in another process it is that process's instrument of the same meter and name."""

    def __init__(self, meter: tuple, create: str, args: tuple, kwargs: dict, inner: Any
                 ) -> None:
        self._meter, self._create, self._args, self._kwargs = meter, create, args, kwargs
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __reduce__(self) -> Any:
        return (_instrument, (self._meter, self._create, self._args, self._kwargs))

    def __repr__(self) -> str:
        return f"<Instrument {self._create[7:]} of meter {self._meter[0]!r}: {self._inner!r}>"


_instruments: dict[tuple, Instrument] = {}  # (pid, meter, create, name) -> one per process


def _instrument(meter: tuple, create: str, args: tuple, kwargs: dict) -> Any:
    """This process's instrument `create(*args, **kwargs)` of meter `meter` (made once:
    OpenTelemetry warns about a second instrument of one name)."""
    name = args[0] if args else kwargs.get("name")
    key = (os.getpid(), repr(meter), create, name)
    with _lock:
        got = _instruments.get(key)
    if got is None:
        got = getattr(get_meter(*meter), create)(*args, **kwargs)
        with _lock:
            got = _instruments.setdefault(key, got)
    return got


def _span_attributes(correlation_id: Optional[int]) -> dict[str, Any]:
    ctx = get_context()
    attrs: dict[str, Any] = {}
    if ctx is not None:
        attrs = {"actor_id": str(ctx.actor_id), "actor_name": ctx.name,
                 "rank": ctx.rank.rank}
    if correlation_id is not None:
        attrs["correlation_id"] = correlation_id
    return attrs


class _Recorded:
    """A span's context manager: records it in this process's timeline (runtime/timeline.py,
    drawn by %mesh timeline) around OpenTelemetry's span, if any."""

    __slots__ = ("name", "inner", "t0")

    def __init__(self, name: str, inner: Any) -> None:
        self.name, self.inner, self.t0 = name, inner, 0

    def __enter__(self) -> Any:
        self.t0 = timeline.now_ns()
        return self.inner.__enter__() if self.inner is not None else _NOOP

    def __exit__(self, et: Any, ev: Any, tb: Any) -> Any:
        timeline.record_span(self.t0, self.name, et is not None)
        return self.inner.__exit__(et, ev, tb) if self.inner is not None else None


def span(name: str, correlation_id: Optional[int] = None) -> Any:
    """A context manager timing a span named `name`, tagged with the calling actor's id,
    mesh name and rank (Monarch's `span(name, correlation_id=None)`); recorded in the
    timeline too (`%mesh timeline`), with or without OpenTelemetry."""
    api = _api()
    if api is None:
        return _Recorded(name, None)
    start()
    tracer = api[1].get_tracer("monarch")
    return _Recorded(name, tracer.start_as_current_span(
        name, attributes=_span_attributes(correlation_id)))


def traced(fn: Any = None, *, name: Optional[str] = None) -> Any:
    """Run each call of a function (sync or async) in a `span` named after it:
    `@traced`, `@traced("name")` or `@traced(name="name")` (Monarch's `traced`)."""
    if isinstance(fn, str):
        name, fn = fn, None
    if fn is None:
        return lambda f: traced(f, name=name)
    label: str = name if name else getattr(fn, "__qualname__", getattr(fn, "__name__", "traced"))
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            with span(label):
                return await fn(*args, **kwargs)
        return run_async

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with span(label):
            return fn(*args, **kwargs)
    return run
