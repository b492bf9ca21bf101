"""The records the runtime keeps of host agents, procs and actor meshes (plain data)."""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from ..config import config
from ..future import Future
from ..supervision import MeshFailure

__all__ = ["ProcState", "AgentRecord", "ProcRecord", "ActorMeshRecord"]


#: a proc's life as its owner sees it: starting (spawned, no hello yet) -> running -> failed
#: or stopped (both final; a failed proc's failure is in `failure`)
ProcState = Literal["starting", "running", "failed", "stopped"]


@dataclass
class AgentRecord:
    """A host agent this runtime uses."""

    agent_id: str
    address: str
    host: str
    popen: Any = None  # subprocess.Popen of a local agent
    procs: set = field(default_factory=set)
    last_seen: float = field(default_factory=time.monotonic)
    alive: bool = True
    remote: bool = False
    hello: bool = False
    lost: bool = False  # remote agent declared unreachable; it may come back
    stale: set = field(default_factory=set)  # procs failed while it was lost: kill on return
    #: how reports name it where several agents share its host (`vm:41234`: host:port)
    name: str = ""
    #: from its attach answer: the procs it kept for a reattaching controller (one dict
    #: each: proc_id, pid, mesh, rank, labels, sizes, keep), why it refused the attach,
    #: and how long ago (seconds) it last heard the controller before this one
    kept: list = field(default_factory=list)
    refused: str = ""
    prev_owner: str = ""
    prev_silent_for: float = 0.0
    prev_alive: bool = False  # the controller before was alive (taken over), not gone
    #: proc mesh name -> the ProcMesh rebuilt here from `kept` (`HostMesh.proc_mesh`)
    adopted: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        """The agent's name in reports: its host, or host:port where its host runs
        several agents of one job."""
        return self.name or self.host


@dataclass
class ProcRecord:
    """A proc this runtime started (owns) or knows of."""

    proc_id: str
    rank: int
    mesh: str
    agent: Optional[AgentRecord]
    address: str
    host: str = ""
    pid: int = 0
    state: ProcState = "starting"
    last_seen: float = field(default_factory=time.monotonic)
    #: when its host agent last said its process runs (not stopped, not gone)
    vouched: Optional[float] = None
    #: it is silent past the heartbeat timeout while its process runs (its GIL held by C
    #: code): said once, in the log, until it is heard again
    silent_running: bool = False
    output: collections.deque = field(default_factory=lambda: collections.deque(maxlen=200))
    stderr_tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=200))
    failure: Optional[MeshFailure] = None
    stopping: bool = False
    exited: Optional[Future] = None
    #: why this runtime killed it on purpose (`kill_procs`: the user's kill(), chaos), for
    #: its failure's cause; and whether that was an injected failure (`is_injected`)
    killed_by: str = ""
    kill_injected: bool = False
    tcp_address: str = ""
    log_stream: bool = True  # forward output to the output sink (logging_option)
    log_window: float = 0.0  # > 0: aggregate output over this many seconds
    #: streams whose last output left its line open (its agent flushed a partial line)
    open_streams: set = field(default_factory=set)
    keep: float = 0.0  # > 0: its agent keeps it this long after this controller goes away

    @property
    def place(self) -> str:
        """Where reports say the proc runs: its host, or its agent's host:port where
        several agents share that host (`host` stays the machine's name)."""
        if self.agent is not None and self.agent.name:
            return self.agent.name
        return self.host

    @property
    def route(self) -> Optional[tuple]:
        """(agent address, proc id) for delivery through the host agent."""
        if self.agent is not None:
            return (self.agent.address, self.proc_id)
        return None


@dataclass
class ActorMeshRecord:
    """Owner-side (or caller-side) state shared by every view of one actor mesh."""

    actor_id: str
    name: str
    cls_name: str
    proc_ids: list  # by global rank
    addresses: list  # by global rank ("" where only the agent can reach the proc)
    hosts: list
    sizes: dict
    owned: bool
    owner_actor: Optional[str] = None
    ready: list = field(default_factory=list)  # per global rank: None, True, or error text
    failed: dict = field(default_factory=dict)  # global rank -> MeshFailure
    stopped: bool = False
    stopped_with_procs: bool = False  # stopped because its proc mesh was
    initialized: Optional[Future] = None
    inflight: list = field(default_factory=list)  # per rank outstanding calls (for choose)
    replied: dict = field(default_factory=dict)  # rank -> time.time() of its last reply here
    shown_busy: set = field(default_factory=set)  # ranks a heartbeat last reported busy
    health_name: str = ""  # the mesh's key in the health model ("" when not owned here)
    sigs: dict = field(default_factory=dict)  # endpoint name -> inspect.Signature or None
    rr: int = 0  # round-robin start for choose()
    routes: list = field(default_factory=list)  # by global rank: (agent address, proc id)
    init_failed: set = field(default_factory=set)  # ranks whose __init__ raised
    explicit_ports: frozenset = frozenset()  # endpoints that answer through a Port they get
    methods: dict = field(default_factory=dict)  # non-endpoint methods (as_endpoint): sigs
    owner_name: str = "<root>"  # the spawner's Monarch name (`<root>.<mod.Cls name{..}>`)
    qual_cls: str = ""  # `module.Class` of the actors
    propagates: dict = field(default_factory=dict)  # endpoint -> its propagate= (rref)
    #: spawned by the runtime or a front-end for its own work (`ProcMesh.spawn_internal`):
    #: views leave it out, and its failures are reported against `serves`
    internal: bool = False
    serves: str = ""  # for an internal mesh: the user's proc mesh it works for
    #: by global rank: {cluster key tag: TCP address} of a proc known here by an ipc
    #: address of another host (runtime._core.reach)
    alts: list = field(default_factory=list)
    #: per rank: bytes of this process's calls in flight (with `inflight`, the call window)
    inflight_bytes: list = field(default_factory=list)
    #: notified as calls end, for callers waiting for room in the window (`room_waiters`)
    room: threading.Condition = field(default_factory=threading.Condition)
    room_waiters: int = 0
    #: per rank: sizes of this process's messages without an answer (broadcast, send) not
    #: yet confirmed taken by the actor (TAKEN), oldest first
    unconfirmed: dict = field(default_factory=dict)
    #: per rank, from its last heartbeat: (state, endpoint, since, messages waiting in its
    #: mailbox, what its handler waits on or None) for `runtime.diagnose`
    diag: dict = field(default_factory=dict)
    #: (len(routes), agents in rank order): `agents()`, kept
    agent_order: Optional[tuple] = None
    #: (len(proc_ids), proc id -> rank): `rank_of`, kept
    rank_index: Optional[tuple] = None
    #: rank -> the last heartbeat entry of its actor: an idle actor's unchanged entry is
    #: skipped (at thousands of procs, heartbeats are most of the controller's work)
    last_beat: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.inflight_bytes) != len(self.inflight):
            self.inflight_bytes = [0] * len(self.inflight)

    def take_room(self, rank: int, size: int, confirm: bool = False) -> None:
        """A message of `size` bytes to `rank` counts against the call window (its room was
        waited for); `confirm`: it expects no answer, the actor's TAKEN ends it."""
        self.inflight[rank] += 1
        self.inflight_bytes[rank] += size
        if confirm:
            self.unconfirmed.setdefault(rank, collections.deque()).append(size)

    def release(self, rank: int, n: int = 1, size: int = 0) -> None:
        """`n` messages of `size` bytes in all to `rank` ended: room in the window; callers
        waiting for room wake once a quarter of it is free."""
        self.inflight[rank] -= n
        self.inflight_bytes[rank] -= size
        if self.room_waiters and self.inflight[rank] <= config.mailbox_limit * 3 // 4 and \
                self.inflight_bytes[rank] <= config.mailbox_bytes * 3 // 4:
            with self.room:
                self.room.notify_all()

    def confirmed(self, rank: int, n: int) -> None:
        """The actor at `rank` took `n` more of this process's messages without an answer
        (I/O thread): the oldest `n` leave the window."""
        sizes = self.unconfirmed.get(rank)
        if not sizes or not 0 <= rank < len(self.inflight):
            return
        n = min(n, len(sizes))
        self.release(rank, n, sum(sizes.popleft() for _ in range(n)))

    def actor_name(self, rank: int) -> str:
        """Monarch's name of the actor at `rank`: its spawner's name, then `<mod.Cls name{..}>`."""
        from ..shapes import Point, Shape

        point = str(Point(rank, Shape(tuple(self.sizes), tuple(self.sizes.values())))) \
            if self.sizes else ""
        return f"{self.owner_name}.<{self.qual_cls or self.cls_name} {self.name}{point}>"

    def target(self, rank: int) -> tuple:
        return (self.addresses[rank], self.routes[rank] if self.routes else None)

    def agents(self) -> tuple:
        """The host agents of this mesh's procs in rank order, each once: the base its cast
        tree is laid over (runtime/transport/casttree.py; one object while routes stay)."""
        got = self.agent_order
        if got is None or got[0] != len(self.routes):
            got = self.agent_order = (len(self.routes), tuple(dict.fromkeys(
                r[0] for r in self.routes if r)))
        return got[1]

    def rank_of(self, proc_id: str) -> int:
        """The rank of `proc_id` in this mesh, or -1 (a lookup: each heartbeat asks it for
        every actor of the proc)."""
        got = self.rank_index
        if got is None or got[0] != len(self.proc_ids):
            got = self.rank_index = (len(self.proc_ids),
                                     {p: r for r, p in enumerate(self.proc_ids)})
        return got[1].get(proc_id, -1)
