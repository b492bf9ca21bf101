"""Static views of a health snapshot: plain text and self-contained HTML (no widgets).

Used by `%mesh status` where widgets are not available and by meshes' `_repr_html_`.
"""

from __future__ import annotations

import html
import time
from typing import Optional

from monarch_widgets.fmt import fmt_bytes, fmt_cpu, fmt_duration, lease_text
from monarch_widgets.state import grid_shape
from runtime.supervision.health import ActorHealth, ActorState, MeshHealth

__all__ = ["COLORS", "SYMBOLS", "render_text", "waiting_note", "select", "render_html"]

COLORS: dict[str, str] = {
    "starting": "#9aa5b1", "idle": "#3fb950", "busy": "#2f81f7", "failed": "#e5534b",
    "stopped": "#57606a", "paused": "#d29922",
}
SYMBOLS: dict[str, str] = {
    "starting": ".", "idle": "o", "busy": "*", "failed": "X", "stopped": "-", "paused": "P",
}


def render_text(snapshot: list[MeshHealth], now: Optional[float] = None, *,
                mesh: Optional[str] = None, proc_mesh: Optional[str] = None) -> str:
    """A terminal-friendly summary: per mesh a symbol grid, its procs, and failures."""
    now = time.time() if now is None else now
    snapshot = select(snapshot, mesh, proc_mesh)
    if not snapshot:
        return "no meshes"
    out: list[str] = []
    for m in snapshot:
        counts = ", ".join(f"{v} {k}" for k, v in sorted(m.counts().items()))
        dims = " x ".join(f"{k}={v}" for k, v in m.sizes.items()) or f"{len(m.actors)}"
        out.append(f"mesh {m.name} [{dims}] on {m.proc_mesh}: {m.state} ({counts})")
        if m.keep:
            out.append(f"  {lease_text(m.keep, m.reattached)}")
        _, cols = grid_shape([[k, v] for k, v in m.sizes.items()], len(m.actors))
        syms = [SYMBOLS[a.state.value] for a in m.actors]
        for i in range(0, len(syms), cols):
            out.append("  " + " ".join(syms[i:i + cols]))
        if m.procs:
            engine = any(p.tensor_bytes is not None for p in m.procs)
            out.append(f"  {'proc':<16} {'host':<14} {'pid':>7} {'cpu':>5} {'rss':>8} {'gpu':>8}"
                       + (f" {'tensors':>8}" if engine else ""))
            for p in m.procs:
                out.append(f"  {p.proc_id:<16} {p.host:<14} {p.pid:>7} "
                           f"{fmt_cpu(p.cpu_percent):>5} {fmt_bytes(p.rss_bytes):>8} "
                           f"{fmt_bytes(p.gpu_mem_bytes):>8}"
                           + (f" {fmt_bytes(p.tensor_bytes):>8}" if engine else ""))
        for a in m.actors:
            if a.state in (ActorState.FAILED, ActorState.PAUSED, ActorState.BUSY) and (
                    a.endpoint or a.last_error):
                what = a.last_error if a.state == ActorState.FAILED else a.endpoint
                out.append(f"  rank {a.rank} {a.state.value} for "
                           f"{fmt_duration(now - a.since)}: {what}" + waiting_note(a))
    out.append("legend: " + "  ".join(f"{v} {k}" for k, v in SYMBOLS.items()))
    return "\n".join(out)


def waiting_note(a: ActorHealth) -> str:
    """"; waits on X; N queued" for a busy (or paused) actor, from its last heartbeat;
    "" otherwise."""
    if a.state not in (ActorState.BUSY, ActorState.PAUSED):
        return ""
    note = f"; waits on {a.waits}" if a.waits else ""
    return note + (f"; {a.queued} queued" if a.queued else "")


def _actor_title(a, now: float) -> str:
    parts = [f"{a.mesh}[{a.rank}] {a.state.value} for {fmt_duration(now - a.since)}",
             f"host {a.host} pid {a.pid} proc {a.proc_id}",
             f"handled {a.handled}, errors {a.errors}"]
    if a.endpoint:
        parts.append(f"endpoint {a.endpoint}")
    if a.state in (ActorState.BUSY, ActorState.PAUSED) and (a.waits or a.queued):
        parts.append(f"waits on {a.waits or '-'}; {a.queued} queued")
    if a.last_error:
        parts.append(f"last error: {a.last_error}")
    return "\n".join(parts)


def select(snapshot: list[MeshHealth], mesh: Optional[str] = None,
           proc_mesh: Optional[str] = None) -> list[MeshHealth]:
    """The meshes of `snapshot` named `mesh` and/or living on proc mesh `proc_mesh`."""
    return [m for m in snapshot if (mesh is None or m.name == mesh)
            and (proc_mesh is None or m.proc_mesh == proc_mesh)]


def render_html(snapshot: list[MeshHealth], now: Optional[float] = None, *,
                mesh: Optional[str] = None, proc_mesh: Optional[str] = None) -> str:
    """Self-contained HTML (inline styles, no script): a coloured grid per mesh, proc table.

    `mesh` / `proc_mesh` keep only those meshes (for a mesh's `_repr_html_`). Hovering a
    cell shows its details (title attribute); failures are listed below."""
    now = time.time() if now is None else now
    snapshot = select(snapshot, mesh, proc_mesh)
    esc = html.escape
    parts = ['<div class="monarch-status" style="font-family:sans-serif;font-size:12px">']
    if not snapshot:
        parts.append("<i>no meshes</i>")
    for m in snapshot:
        counts = ", ".join(
            f'<span style="color:{COLORS[k]}">{v} {esc(k)}</span>'
            for k, v in sorted(m.counts().items()))
        dims = " &times; ".join(f"{esc(k)}={v}" for k, v in m.sizes.items())
        _, cols = grid_shape([[k, v] for k, v in m.sizes.items()], len(m.actors))
        parts.append(f'<div style="margin:4px 0"><b>{esc(m.name)}</b> [{dims}] on '
                     f'{esc(m.proc_mesh)}: <b style="color:{COLORS.get(m.state, "#000")}">'
                     f'{esc(m.state)}</b> ({counts})</div>')
        if m.keep:
            parts.append(f'<div class="monarch-lease" data-keep="{m.keep:g}" '
                         f'style="color:#8250df">{esc(lease_text(m.keep, m.reattached))}</div>')
        parts.append(f'<div style="display:grid;grid-template-columns:repeat({cols},14px);'
                     f'gap:2px;margin-bottom:4px">')
        for a in m.actors:
            waiting = bool(waiting_note(a))
            mark = ";outline:2px dashed #d29922" if waiting else ""
            parts.append(f'<div data-rank="{a.rank}" data-state="{a.state.value}"'
                         + (' data-waiting="1"' if waiting else "") +
                         f' title="{esc(_actor_title(a, now))}" style="width:14px;height:14px;'
                         f'border-radius:2px;background:{COLORS[a.state.value]}{mark}"></div>')
        parts.append("</div>")
        if m.procs:
            engine = any(p.tensor_bytes is not None for p in m.procs)
            parts.append('<table style="border-collapse:collapse;font-size:11px">'
                         "<tr><th>proc</th><th>host</th><th>pid</th><th>CPU</th>"
                         "<th>RSS</th><th>GPU mem</th>"
                         + ("<th>tensors</th>" if engine else "") + "</tr>")
            for p in m.procs:
                parts.append(f"<tr><td>{esc(p.proc_id)}</td><td>{esc(p.host)}</td>"
                             f"<td>{p.pid}</td><td>{fmt_cpu(p.cpu_percent)}</td>"
                             f"<td>{fmt_bytes(p.rss_bytes)}</td>"
                             f"<td>{fmt_bytes(p.gpu_mem_bytes)}</td>"
                             + (f"<td>{fmt_bytes(p.tensor_bytes)}</td>" if engine else "")
                             + "</tr>")
            parts.append("</table>")
        for a in m.actors:
            note = waiting_note(a)
            if note:
                parts.append(f'<div class="monarch-waiting">rank {a.rank} {a.state.value} in '
                             f'{esc(a.endpoint or "?")}() for {fmt_duration(now - a.since)}'
                             f'{esc(note)}</div>')
            if a.state == ActorState.FAILED and a.last_error:
                tb = (f"<pre style='font-size:10px;max-height:12em;overflow:auto'>"
                      f"{esc(a.last_traceback)}</pre>" if a.last_traceback else "")
                parts.append(f'<details><summary style="color:{COLORS["failed"]}">rank '
                             f'{a.rank} failed: {esc(a.last_error)}</summary>{tb}</details>')
    parts.append("</div>")
    return "".join(parts)
