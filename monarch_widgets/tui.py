"""The terminal admin: a textual app showing hosts, procs and actors of a controller, live.

It reads from a *source*: an `AdminClient` attached to a controller's admin endpoint, or
any object with the same methods (tests use a fake). Source calls run on worker threads,
so a slow or vanished controller never freezes the screen.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional, Protocol

from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Footer, Header, Label, Log, Static, Tree
from textual.widgets.tree import TreeNode

from monarch_widgets.fmt import fmt_bytes, fmt_cpu, fmt_duration
from monarch_widgets.render import COLORS, waiting_note
from runtime.supervision.health import ActorHealth, MeshHealth, ProcStats

__all__ = [
    "Key", "Source", "stack_text", "ConfirmScreen", "proc_stats", "layout", "find_actor",
    "AdminApp",
]

Key = tuple  # ("host", host) | ("proc", proc_id) | ("actor", mesh, rank)


class Source(Protocol):
    """What the admin app needs from a controller (AdminClient implements it)."""

    def snapshot(self) -> list[MeshHealth]: ...
    def output_tail(self, proc_id: str, n: int = 200) -> list[str]: ...
    def dump_stack(self, proc_id: str, timeout: float = 10.0) -> str: ...
    def stop_mesh(self, name: str) -> int: ...
    def kill_proc(self, proc_id: str) -> bool: ...


def stack_text(source: Any, proc_id: str, native: bool = False) -> str:
    """A proc's stacks for the stack view: py-spy's from outside when the source offers
    them (`py_spy_stack`), else, or when py-spy fails, the proc's own dump after its reason."""
    parts: list[str] = []
    spy = getattr(source, "py_spy_stack", None)
    if spy is not None:
        try:
            text = str(spy(proc_id, native=native))
        except Exception as e:
            text = f"py-spy stacks failed: {type(e).__name__}: {e}"
        if "\n!! " not in text and not text.startswith("py-spy stacks failed"):
            return text
        parts += [text, "", "-- the proc's own dump (needs its GIL) --"]
    try:
        parts.append(source.dump_stack(proc_id))
    except Exception as e:
        parts.append(f"stack dump failed: {type(e).__name__}: {e}")
    return "\n".join(parts)


class ConfirmScreen(ModalScreen[bool]):
    """Asks yes or no before a destructive action."""

    BINDINGS = [Binding("y", "answer(True)", "Yes"), Binding("n", "answer(False)", "No"),
                Binding("escape", "answer(False)", "No", show=False)]
    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    #confirm { width: 60; height: auto; border: thick $warning; padding: 1 2; background: $surface; }
    #confirm Horizontal { height: auto; align: center middle; margin-top: 1; }
    #confirm Button { margin: 0 2; }
    """

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm"):
            yield Label(self.question, id="question")
            with Horizontal():
                yield Button("Yes (y)", variant="error", id="yes")
                yield Button("No (n)", variant="primary", id="no")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()  # the safe answer is the default

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


def _state_text(state: str) -> Text:
    return Text.assemble(("\u25cf " + state, COLORS.get(state, "white")))


# -- indexing a snapshot (pure) ------------------------------------------------------------
def proc_stats(snapshot: list[MeshHealth]) -> dict[str, ProcStats]:
    """proc id -> its resource figures."""
    return {p.proc_id: p for m in snapshot for p in m.procs}


def layout(snapshot: list[MeshHealth]) -> dict[str, dict[str, list[ActorHealth]]]:
    """host -> proc id -> the actors on it."""
    hosts: dict[str, dict[str, list[ActorHealth]]] = {}
    for a in (a for m in snapshot for a in m.actors):
        hosts.setdefault(a.host or "?", {}).setdefault(a.proc_id or "?", []).append(a)
    return hosts


def find_actor(snapshot: list[MeshHealth], mesh: str, rank: int) -> Optional[ActorHealth]:
    """The actor at `rank` of `mesh`, or None."""
    for m in snapshot:
        if m.name == mesh:
            for a in m.actors:
                if a.rank == rank:
                    return a
    return None


class AdminApp(App[None]):
    """Tree of hosts/procs/actors, a detail pane, the selected proc's output and stack."""

    TITLE = "monarch admin"
    CSS = """
    #main { height: 1fr; }
    #tree { width: 46%; border: round $primary; }
    #right { width: 1fr; }
    #detail { height: auto; max-height: 45%; border: round $secondary; padding: 0 1; }
    #output { height: 1fr; border: round $secondary; }
    #stack { height: 1fr; border: round $warning; display: none; }
    #stack.shown { display: block; }
    """
    BINDINGS = [
        Binding("r", "refresh", "Refresh"),
        Binding("s", "stack", "Stack"),
        Binding("S", "stack(True)", "Native stack", show=False),
        Binding("k", "stop_proc", "Stop proc"),
        Binding("x", "stop_mesh", "Stop mesh"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, source: Source, *, refresh_interval: float = 1.0,
                 clock: Callable[[], float] = time.time, label: str = "") -> None:
        super().__init__()
        self.source = source
        self.refresh_interval = refresh_interval
        self.clock = clock
        self.label = label
        self.snapshot: list[MeshHealth] = []
        self.selected: Optional[Key] = None
        self.tree_nodes: dict[Key, TreeNode] = {}
        self.tree_keys: list[Key] = []
        self.error: Optional[str] = None

    # -- layout ---------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            tree: Tree[Key] = Tree(self.label or "controller", id="tree")
            tree.show_root = True
            tree.root.expand()
            yield tree
            with Vertical(id="right"):
                yield Static("select a host, proc or actor", id="detail")
                out = Log(id="output", max_lines=2000)
                out.border_title = "output"
                yield out
                stack = Log(id="stack")
                stack.border_title = "stack"
                yield stack
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#tree", Tree).border_title = "hosts / procs / actors"
        self.query_one("#detail", Static).border_title = "detail"
        self.action_refresh()
        if self.refresh_interval > 0:
            self.set_interval(self.refresh_interval, self.action_refresh)

    # -- data -----------------------------------------------------------------------------
    def action_refresh(self) -> None:
        self._fetch(self._selected_proc())

    @work(thread=True, exclusive=True, group="fetch")
    def _fetch(self, proc_id: Optional[str]) -> None:
        try:
            snap = self.source.snapshot()
            tail = self.source.output_tail(proc_id) if proc_id else None
        except Exception as e:
            self.call_from_thread(self._disconnected, f"{type(e).__name__}: {e}")
            return
        self.call_from_thread(self._apply, snap, proc_id, tail)

    def _disconnected(self, why: str) -> None:
        self.error = why
        self.sub_title = f"error: {why}"

    def _apply(self, snap: list[MeshHealth], proc_id: Optional[str],
               tail: Optional[list[str]]) -> None:
        self.error = None
        self.snapshot = snap
        n = sum(len(m.actors) for m in snap)
        failed = sum(m.counts().get("failed", 0) for m in snap)
        self.sub_title = f"{len(snap)} meshes, {n} actors" + (f", {failed} failed" if failed else "")
        self._update_tree()
        self._show_detail()
        if tail is not None and proc_id == self._selected_proc():
            self._show_output(proc_id, tail)

    def _selected_proc(self) -> Optional[str]:
        sel = self.selected
        if sel is None:
            return None
        if sel[0] == "proc":
            return sel[1]
        if sel[0] == "actor":
            a = find_actor(self.snapshot, sel[1], sel[2])
            return a.proc_id if a else None
        return None

    # -- tree -----------------------------------------------------------------------------
    def _labels(self) -> dict[Key, tuple[Text, Optional[Key]]]:
        """Every tree node: key -> (label, parent key), parents before children."""
        stats = proc_stats(self.snapshot)
        labels: dict[Key, tuple[Text, Optional[Key]]] = {}
        for host, procs in layout(self.snapshot).items():
            hkey = ("host", host)
            actors = [a for acts in procs.values() for a in acts]
            bad = sum(a.state.value == "failed" for a in actors)
            labels[hkey] = (Text.assemble(
                (host, "bold"),
                (f"  {len(procs)} procs" + (f", {bad} failed" if bad else ""), "dim")), None)
            for proc_id, acts in procs.items():
                pkey = ("proc", proc_id)
                st = stats.get(proc_id)
                pid = st.pid if st else acts[0].pid
                worst = "failed" if any(a.state.value == "failed" for a in acts) else (
                    acts[0].state.value)
                t = Text.assemble(("\u25a0 ", COLORS.get(worst, "white")), proc_id,
                                  (f"  pid {pid}", "dim"))
                if st:
                    t += Text(f"  {fmt_cpu(st.cpu_percent)} {fmt_bytes(st.rss_bytes)}",
                              style="dim")
                labels[pkey] = (t, hkey)
                for a in acts:
                    at = Text(f"{a.mesh}[{a.rank}] ") + _state_text(a.state.value)
                    if a.endpoint:
                        at += Text(f" {a.endpoint}", style="italic")
                    if waiting_note(a):  # what its handler waits on (runtime.diagnose's)
                        what = a.waits or f"{a.queued} queued"
                        at += Text(f"  waits on {what[:48]}" + ("..." if len(what) > 48
                                                                else ""),
                                   style=COLORS["paused"])
                    labels[("actor", a.mesh, a.rank)] = (at, pkey)
        return labels

    def _update_tree(self) -> None:
        tree = self.query_one("#tree", Tree)
        labels = self._labels()
        structure = list(labels)
        if structure == self.tree_keys:
            for key, (text, _) in labels.items():
                self.tree_nodes[key].set_label(text)
            return
        collapsed = {k for k, n in self.tree_nodes.items() if not n.is_expanded and
                     k[0] != "actor"}
        tree.clear()
        self.tree_nodes = {}
        for key, (text, parent_key) in labels.items():
            parent = tree.root if parent_key is None else self.tree_nodes[parent_key]
            if key[0] == "actor":
                node = parent.add_leaf(text, data=key)
            else:
                node = parent.add(text, data=key, expand=key not in collapsed)
            self.tree_nodes[key] = node
        self.tree_keys = structure
        if self.selected in self.tree_nodes:
            tree.move_cursor(self.tree_nodes[self.selected])

    def _host_of_proc(self, proc_id: str) -> str:
        for host, procs in layout(self.snapshot).items():
            if proc_id in procs:
                return host
        return "?"

    @on(Tree.NodeHighlighted)
    def _highlighted(self, event: Tree.NodeHighlighted) -> None:
        key = event.node.data
        if key == self.selected:
            return
        self.selected = key
        self._show_detail()
        proc = self._selected_proc()
        self.query_one("#output", Log).clear()
        self.query_one("#stack", Log).remove_class("shown")
        if proc:
            self._fetch(proc)

    # -- panes ----------------------------------------------------------------------------
    def _show_detail(self) -> None:
        self.query_one("#detail", Static).update(self._detail_text())

    def _detail_text(self) -> Text:
        sel = self.selected
        now = self.clock()
        if sel is None:
            return Text("select a host, proc or actor")
        if sel[0] == "host":
            procs = layout(self.snapshot).get(sel[1], {})
            acts = [a for v in procs.values() for a in v]
            counts: dict[str, int] = {}
            for a in acts:
                counts[a.state.value] = counts.get(a.state.value, 0) + 1
            return Text(f"host {sel[1]}\n{len(procs)} procs, {len(acts)} actors\n" +
                        ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
        if sel[0] == "proc":
            st = proc_stats(self.snapshot).get(sel[1])
            acts = layout(self.snapshot).get(self._host_of_proc(sel[1]), {}).get(sel[1], [])
            t = Text.assemble((f"proc {sel[1]}", "bold"), "\n")
            if st:
                t += Text(f"host {st.host}  pid {st.pid}\nCPU {fmt_cpu(st.cpu_percent)}  "
                          f"RSS {fmt_bytes(st.rss_bytes)}  GPU mem {fmt_bytes(st.gpu_mem_bytes)}"
                          + (f"  tensors {fmt_bytes(st.tensor_bytes)}"
                             if st.tensor_bytes is not None else "") + "\n")
            elif acts:
                t += Text(f"host {acts[0].host}  pid {acts[0].pid}\n")
            t += Text("actors: " + ", ".join(f"{a.mesh}[{a.rank}] {a.state.value}"
                                             for a in acts))
            return t
        a = find_actor(self.snapshot, sel[1], sel[2])
        if a is None:
            return Text(f"{sel[1]}[{sel[2]}] is gone")
        t = Text.assemble((f"{a.mesh}[{a.rank}] ", "bold"), _state_text(a.state.value))
        t += Text(f" for {fmt_duration(now - a.since)}\n")
        coords = ", ".join(f"{k}={v}" for k, v in a.coords.items())
        t += Text(f"coords {coords}\nproc {a.proc_id} on {a.host} pid {a.pid}\n"
                  f"endpoint {a.endpoint or '-'}\nmessages {a.handled} handled, "
                  f"{a.errors} errors\n")
        if waiting_note(a):
            t += Text(f"waits on {a.waits or '- (runs code)'}\n{a.queued} message(s) queued "
                      "behind it (%mesh why explains)\n", style=COLORS["paused"])
        if a.last_error:
            t += Text(f"last error: {a.last_error}\n", style="bold red")
        if a.last_traceback:
            t += Text(a.last_traceback.rstrip(), style="red")
        return t

    def _show_output(self, proc_id: str, lines: list[str]) -> None:
        out = self.query_one("#output", Log)
        out.border_title = f"output of {proc_id}"
        out.clear()
        out.write_lines([ln.rstrip("\n") for ln in lines])

    # -- actions --------------------------------------------------------------------------
    def action_stack(self, native: bool = False) -> None:
        """`s`: the selected proc's threads, taken from outside by py-spy when the source
        offers it (`S`: with native frames), else (or when py-spy fails) the proc's own dump."""
        proc = self._selected_proc()
        if not proc:
            self.notify("select a proc or an actor first", severity="warning")
            return
        stack = self.query_one("#stack", Log)
        stack.add_class("shown")
        stack.border_title = f"stack of {proc}"
        stack.clear()
        stack.write_line("dumping stacks ...")
        self._dump(proc, native)

    @work(thread=True, group="stack")
    def _dump(self, proc_id: str, native: bool = False) -> None:
        self.call_from_thread(self._show_stack, proc_id, stack_text(self.source, proc_id, native))

    def _show_stack(self, proc_id: str, text: str) -> None:
        stack = self.query_one("#stack", Log)
        stack.border_title = f"stack of {proc_id}"
        stack.clear()
        stack.write_lines(text.splitlines())

    def action_stop_proc(self) -> None:
        proc = self._selected_proc()
        if not proc:
            self.notify("select a proc or an actor first", severity="warning")
            return

        def done(yes: Optional[bool]) -> None:
            if yes:
                self._act("kill_proc", proc, f"stopped proc {proc}")

        self.push_screen(ConfirmScreen(f"Stop proc {proc}? Its actors will fail."), done)

    def action_stop_mesh(self) -> None:
        sel = self.selected
        if sel is None or sel[0] != "actor":
            self.notify("select an actor of the mesh to stop", severity="warning")
            return
        mesh = sel[1]

        def done(yes: Optional[bool]) -> None:
            if yes:
                self._act("stop_mesh", mesh, f"stopped mesh {mesh}")

        self.push_screen(ConfirmScreen(f"Stop mesh {mesh}? All its actors stop."), done)

    @work(thread=True, group="actions")
    def _act(self, method: str, arg: str, ok: str) -> None:
        try:
            getattr(self.source, method)(arg)
        except Exception as e:
            self.call_from_thread(self.notify, f"{method} failed: {e}", severity="error")
            return
        self.call_from_thread(self.notify, ok)
        self.call_from_thread(self.action_refresh)
