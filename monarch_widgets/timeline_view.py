"""Drawing a `runtime.Timeline` (`runtime.read_timeline`): one lane per rank, endpoint calls
as bars, user spans as thinner bars under them, failures in red with a marker; an inline
SVG in HTML, so a notebook shows it without a widget (`%mesh timeline`, the dashboard's
timeline tab). Bars closer than a pixel are merged (their count is in the tooltip), so a
lane costs at most a few hundred elements however many records it has."""

from __future__ import annotations

import html
from typing import Any, Optional

__all__ = ["LABEL_W", "LANE_H", "CALL_H", "SPAN_H", "AXIS_H", "timeline_html"]

LABEL_W = 130
LANE_H = 30
CALL_H = 16
SPAN_H = 7
AXIS_H = 22


def _fmt_dur(ns: float) -> str:
    s = ns / 1e9
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.0f} us"


def _extent(tl: Any) -> tuple[int, int]:
    """The time range drawn: the records' own (a little padded), within the timeline's."""
    recs = tl.records
    if not recs:
        return tl.start_ns, tl.end_ns
    lo = max(tl.start_ns, min(r[0] for r in recs))
    hi = max(r[1] for r in recs)
    pad = max(int((hi - lo) * 0.03), 1_000_000)
    return max(tl.start_ns, lo - pad), hi + pad


def _bars(records: list, kind: str, x: Any) -> list[tuple[float, float, list]]:
    """Merged bars [(x0, x1, records)] of one lane and kind, in time order: a record joins
    the bar before it when they touch, unless either failed (a failed one stands alone).
    Linear in the records (a bar grows in place)."""
    out: list[list] = []  # [x0, x1, records, failed]
    for r in sorted((r for r in records if r[2] == kind), key=lambda r: r[0]):
        x0, x1 = x(r[0]), max(x(r[1]), x(r[0]) + (3.0 if r[6] else 1.0))
        last = out[-1] if out else None
        if last is not None and x0 <= last[1] + 0.5 and not r[6] and not last[3]:
            last[1] = max(last[1], x1)
            last[2].append(r)
        else:
            out.append([x0, x1, [r], bool(r[6])])
    return [(x0, x1, recs) for x0, x1, recs, _ in out]


def _title(recs: list) -> str:
    if len(recs) == 1:
        s, e, kind, name, actor, rank, failed = recs[0]
        who = f"{actor}[{rank}] " if actor else ""
        return f"{who}{kind} {name}: {_fmt_dur(e - s)}" + (" FAILED" if failed else "")
    names = sorted({r[3] for r in recs})
    busy = sum(r[1] - r[0] for r in recs)
    return (f"{len(recs)} {recs[0][2]}s ({', '.join(names[:4])}"
            f"{', ...' if len(names) > 4 else ''}): {_fmt_dur(busy)} in all")


def timeline_html(tl: Any, width: int = 900, title: Optional[str] = None) -> str:
    """An HTML block with an SVG of `tl` (a runtime.Timeline): a lane per rank, calls
    as bars, spans under them, failed ones red and marked, a time axis in seconds."""
    if width < LABEL_W + 100:
        raise ValueError(f"width must be at least {LABEL_W + 100} pixels, got {width}")
    t0, t1 = _extent(tl)
    span_ns = max(1, t1 - t0)
    plot_w = width - LABEL_W - 10

    def x(ns: int) -> float:
        return LABEL_W + (ns - t0) * plot_w / span_ns

    height = AXIS_H + LANE_H * max(1, len(tl.lanes)) + 6
    parts = [f'<svg class="mt-timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" '
             f'height="{height}" data-mesh="{html.escape(tl.mesh)}" '
             f'style="font:11px sans-serif;background:#fff">']
    for i in range(6):  # the axis: seconds before the end of the drawn range
        tx = LABEL_W + plot_w * i / 5
        ago = (t1 - (t0 + span_ns * i / 5)) / 1e9
        parts.append(f'<line x1="{tx:.1f}" y1="{AXIS_H - 4}" x2="{tx:.1f}" y2="{height}" '
                     f'stroke="#eee"/><text x="{tx:.1f}" y="{AXIS_H - 8}" '
                     f'text-anchor="middle" fill="#666">-{ago:.3g} s</text>')
    for li, lane in enumerate(tl.lanes):
        y = AXIS_H + li * LANE_H
        label = f"{lane.mesh}[{lane.rank}]"
        parts.append(f'<g class="mt-lane" data-rank="{lane.rank}" '
                     f'data-records="{len(lane.records)}">')
        parts.append(f'<rect x="0" y="{y}" width="{width}" height="{LANE_H}" '
                     f'fill="{"#fafafa" if li % 2 else "#fff"}"/>')
        parts.append(f'<text x="4" y="{y + 15}" fill="#333">{html.escape(label)}'
                     f'<title>{html.escape(f"{lane.host} pid {lane.pid}")}</title></text>')
        if lane.error:
            parts.append(f'<text class="mt-lane-error" x="{LABEL_W}" y="{y + 15}" '
                         f'fill="#b00">{html.escape(lane.error)}</text>')
        for kind, top, h, color in (("call", y + 3, CALL_H, "#4c78a8"),
                                    ("span", y + 4 + CALL_H, SPAN_H, "#54a24b")):
            bars = _bars(lane.records, kind, x)  # failed ones last: drawn on top
            for x0, x1, recs in sorted(bars, key=lambda b: any(r[6] for r in b[2])):
                failed = any(r[6] for r in recs)
                parts.append(
                    f'<rect class="mt-{kind}{" mt-failed" if failed else ""}" '
                    f'data-kind="{kind}" data-failed="{int(failed)}" data-count="{len(recs)}" '
                    f'x="{x0:.1f}" y="{top}" width="{x1 - x0:.1f}" height="{h}" '
                    f'fill="{"#e45756" if failed else color}">'
                    f'<title>{html.escape(_title(recs))}</title></rect>')
                if failed:  # a marker that stays visible however short the bar
                    parts.append(f'<path class="mt-fail-mark" d="M{x0 - 5:.1f},{y + 1} '
                                 f'l10,0 l-5,8 z" fill="#d00"/>')
        parts.append("</g>")
    parts.append("</svg>")
    n = len(tl.records)
    failed = sum(1 for r in tl.records if r[6])
    head = title or (f"<b>{html.escape(tl.mesh)}</b>: {len(tl.lanes)} ranks, {n} records"
                     f"{f', {failed} failed' if failed else ''}, {_fmt_dur(t1 - t0)} shown "
                     f"<span style='color:#4c78a8'>&#9632; calls</span> "
                     f"<span style='color:#54a24b'>&#9632; spans</span> "
                     f"<span style='color:#e45756'>&#9632; failed</span>")
    return f'<div class="mt-box"><div class="mt-head">{head}</div>{"".join(parts)}</div>'
