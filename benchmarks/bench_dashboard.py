"""Dashboard cost with many actors: bytes and time per update, Python side and browser side.

    PYTHONPATH=. python benchmarks/bench_dashboard.py [--browser]

Python: building and encoding the widget's compact state, against a reference measured in
the same run (the admin endpoint's full JSON of the same snapshot). Browser (optional,
needs /usr/bin/chromium and playwright): time for the front-end to apply one update to
the grid, 1,000 actors against 4 actors. Progress goes to stderr, the tables to stdout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _ref_common import progress  # noqa: E402

from monarch_widgets.state import build_state  # noqa: E402
from runtime.admin.codec import encode_snapshot  # noqa: E402
from runtime.supervision.health import (ActorHealth, ActorState, HealthModel,  # noqa: E402
                                        ProcStats)


def model_of(n: int, per_host: int = 8) -> HealthModel:
    m = HealthModel()
    now = time.time()
    actors = []
    for r in range(n):
        host = f"host{r // per_host}"
        actors.append(ActorHealth("trainers", r, {"hosts": r // per_host, "gpus": r % per_host},
                                  ActorState.IDLE, proc_id=f"trainers-{r}-abcdef", host=host,
                                  pid=10000 + r, since=now - 5))
        m.update_proc(ProcStats(f"trainers-{r}-abcdef", host, 10000 + r, 97.0, 3 << 30, 40 << 30))
    m.add_mesh("trainers", "procs", {"hosts": max(1, n // per_host), "gpus": min(n, per_host)},
               actors)
    for r in range(0, n, 3):
        m.update("trainers", r, ActorState.BUSY, endpoint="train_step", handled=r)
    for r in range(0, n, 97):
        m.update("trainers", r, ActorState.FAILED, last_error="RuntimeError: CUDA error",
                 last_traceback="Traceback (most recent call last):\n" + "  frame\n" * 30)
    return m


def timeit(fn, repeat: int = 21) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def python_side() -> None:
    print("Python side, per update (median of 21)")
    print(f"{'actors':>7} {'widget bytes':>13} {'ref bytes':>10} {'size ratio':>10} "
          f"{'widget ms':>10} {'ref ms':>8} {'time ratio':>10}")
    for n in (4, 100, 1000, 4000):
        progress(f"Python side: {n} actors")
        m = model_of(n)
        now = time.time()

        def widget() -> bytes:
            return json.dumps(build_state(m.snapshot(), now=now), separators=(",", ":")).encode()

        def ref() -> bytes:
            return json.dumps(encode_snapshot(m.snapshot())).encode()

        wb, rb = len(widget()), len(ref())
        wt, rt = timeit(widget), timeit(ref)
        print(f"{n:>7} {wb:>13} {rb:>10} {wb / rb:>10.2f} {wt * 1e3:>10.2f} {rt * 1e3:>8.2f} "
              f"{wt / rt:>10.2f}", flush=True)


def coalescing() -> None:
    """Pushes a second of a widget under a burst of changes, against its max_rate."""
    import threading

    from monarch_widgets.widget import Dashboard

    print("\nCoalescing: 4 threads change 100 actors, over and over, for 2 s")
    print(f"{'max_rate':>8} {'changes':>8} {'pushes':>7} {'pushes/s':>9}")
    for rate in (4.0, 10.0):
        m = model_of(100)
        w = Dashboard(m, max_rate=rate)
        try:
            start, t0, changes = w.pushes, time.monotonic(), [0]

            def burst(k: int) -> None:
                i = 0
                while time.monotonic() - t0 < 2.0:
                    for r in range(k, 100, 4):
                        m.update("trainers", r, ActorState.BUSY if i % 2 else ActorState.IDLE,
                                 handled=i)
                        changes[0] += 1
                    i += 1

            ts = [threading.Thread(target=burst, args=(k,)) for k in range(4)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            dt = time.monotonic() - t0
            n = w.pushes - start
            print(f"{rate:>8g} {changes[0]:>8} {n:>7} {n / dt:>9.2f}", flush=True)
        finally:
            w.close()


def browser_side() -> None:
    from playwright.sync_api import sync_playwright

    sys.path.insert(0, str(ROOT / "tests" / "browser"))
    from labserver import CHROMIUM, CHROMIUM_ARGS

    js = (ROOT / "monarch_widgets" / "static" / "dashboard.js").read_text()
    js = js.replace("export default { render };", "window.__mw = { render };")
    css = (ROOT / "monarch_widgets" / "static" / "dashboard.css").read_text()
    print("\nBrowser side (chromium, headless): one update applied to the grid, median of 20")
    print(f"{'actors':>7} {'ms/update':>10} {'ratio to 4':>10}")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = b.new_page()
        page.set_content("<div id=root></div>")
        page.add_style_tag(content=css)
        page.add_script_tag(content=js)
        base = None
        for n in (4, 100, 1000, 4000):
            progress(f"browser side: {n} actors")
            m = model_of(n)
            states = []
            for k in range(2):  # two alternating states, so every update changes cells
                for r in range(k, n, 2):
                    m.update("trainers", r, ActorState.BUSY if k else ActorState.IDLE)
                states.append(json.dumps(build_state(m.snapshot(), now=time.time()),
                                         separators=(",", ":")))
            ms = page.evaluate("""([a, b]) => {
                document.getElementById('root').replaceChildren();
                let payload = a, cb = null;
                const model = {get: () => payload, on: (e, f) => { cb = f; }, off: () => {},
                               send: () => {}};
                window.__mw.render({model, el: document.getElementById('root')});
                const times = [];
                for (let i = 0; i < 20; i++) {
                  payload = i % 2 ? a : b;
                  const t0 = performance.now();
                  cb();
                  document.body.offsetHeight;  // force layout
                  times.push(performance.now() - t0);
                }
                times.sort((x, y) => x - y);
                return times[10];
            }""", states)
            base = base or ms
            print(f"{n:>7} {ms:>10.2f} {ms / base:>10.1f}", flush=True)
        b.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--browser", action="store_true", help="also time the front-end")
    args = ap.parse_args()
    python_side()
    coalescing()
    if args.browser:
        browser_side()
