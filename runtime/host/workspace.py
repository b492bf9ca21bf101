"""The host agent's side of `HostMesh.sync_workspace`: the one writer of this host's copy.

The copy lives in `<agent run directory>/workspace-<agent id>/` (mode 0700, removed with
the run directory). Each sync builds a complete new generation `gen-N/` (hard links to the
unchanged files of the previous one, the new contents written aside in `incoming/` first,
then linked), writes its manifest, and switches the `current` link to it with one
rename: procs see every file of a sync at once, and files the sync deleted are gone. A sync
replaces only the directories it names (`names` in the offer): the other directories an
earlier sync put there stay (syncing directory B after A keeps A).
Procs import from `current/<name>` (`runtime.proc._reload`). A new generation starts without
`__pycache__`, so no stale bytecode survives an edit that kept size and mtime.

Protocol (Kind.WORKSPACE, answered with a REPLY on the caller's port, in order, by one
worker thread so the agent's I/O thread never waits for the disk):
  offer  (body: JSON manifest {rel: [sha256, size, mode]}, extra "names": the directories
          it covers) -> {"need": [sha256, ...]}
  put    (extra "digests", one buffer per digest)         -> {"stored": n}
  commit                                                    -> {"root", "gen", "changed", ...}
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import re
import shutil
import threading
from typing import Any, Callable

from ..transport.framing import ERROR, OK, Header, Kind

__all__ = ["MANIFEST", "WorkspaceStore"]

log = logging.getLogger("runtime.host")
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
MANIFEST = ".manifest.json"


def _safe_rel(rel: str) -> bool:
    parts = rel.split("/")
    return len(parts) >= 2 and not rel.startswith("/") and \
        all(p and p not in (".", "..") for p in parts) and not parts[0].startswith(".")


class WorkspaceStore:
    """This host's synced workspace: one worker thread applies the controller's requests."""

    def __init__(self, rundir: str, agent_id: str, send: Callable[[str, Header, bytes], None]
                 ) -> None:
        self.root = os.path.join(rundir, f"workspace-{agent_id}")
        self._send = send
        self.current: dict[str, list] = {}  # rel -> [digest, size, mode]
        self.gen = 0
        self._pending: dict[str, dict] = {}  # sync id -> the manifest after its commit
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: Any = None

    @property
    def active(self) -> str:
        """The root procs import from ('' before the first sync)."""
        return self.root if self.gen else ""

    def on_message(self, h: Header, body: Any, buffers: list) -> None:
        """A WORKSPACE request (I/O thread): queued for the worker thread."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="workspace", daemon=True)
            self._thread.start()
        self._queue.put((h, body, buffers))

    def _work(self) -> None:
        while True:
            h, body, buffers = self._queue.get()
            op = str((h.extra or {}).get("op"))
            try:
                fn = {"offer": self._offer, "put": self._put, "commit": self._commit}[op]
                out = fn(h.extra, body, buffers)
                status, data = OK, json.dumps(out).encode()
            except Exception as e:  # noqa: BLE001 - the controller reports it for this host
                log.warning("workspace %s failed: %s", op, e)
                status, data = ERROR, f"{type(e).__name__}: {e}".encode()
            del body, buffers
            if h.reply and h.port:
                self._send(h.reply, Header(Kind.REPLY, port=h.port, status=status), data)

    def _dir(self, *parts: str) -> str:
        path = os.path.join(self.root, *parts)
        os.makedirs(path, mode=0o700, exist_ok=True)
        return path

    def _offer(self, extra: dict, body: Any, buffers: list) -> dict:
        manifest = json.loads(bytes(body))
        for rel, (digest, size, mode) in manifest.items():
            if not _safe_rel(rel) or not _DIGEST.match(digest):
                raise ValueError(f"bad workspace entry {rel!r}")
        names = set(extra.get("names") or ()) | {r.split("/", 1)[0] for r in manifest}
        if any(not n or "/" in n or n.startswith(".") for n in names):
            raise ValueError(f"bad workspace names {sorted(names)!r}")
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        os.chmod(self.root, 0o700)
        # the directories this sync does not name stay as an earlier sync left them
        kept = {r: e for r, e in self.current.items() if r.split("/", 1)[0] not in names}
        self._pending = {extra["sync"]: {**kept, **manifest}}  # one sync at a time
        have = {e[0] for e in self.current.values()}
        incoming = os.path.join(self.root, "incoming")
        stored = set(os.listdir(incoming)) if os.path.isdir(incoming) else set()
        need = sorted({e[0] for e in manifest.values()} - have - stored)
        return {"need": need}

    def _put(self, extra: dict, body: Any, buffers: list) -> dict:
        digests = extra["digests"]
        if len(digests) != len(buffers):
            raise ValueError("workspace put: digests and contents differ in number")
        incoming = self._dir("incoming")
        for digest, data in zip(digests, buffers):
            if not _DIGEST.match(digest) or hashlib.sha256(data).hexdigest() != digest:
                raise ValueError(f"workspace put: content of {digest[:12]} does not match its "
                                 "hash (changed while being sent?)")
            tmp = os.path.join(incoming, f".{digest}.tmp")
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, os.path.join(incoming, digest))  # written aside, then renamed
        return {"stored": len(digests)}

    def _commit(self, extra: dict, body: Any, buffers: list) -> dict:
        manifest = self._pending.pop(extra["sync"], None)
        if manifest is None:
            raise ValueError("workspace commit without an offer")
        old_gen = os.path.join(self.root, f"gen-{self.gen}")
        by_digest = {e[0]: os.path.join(old_gen, rel) for rel, e in self.current.items()}
        incoming = os.path.join(self.root, "incoming")
        new = os.path.join(self.root, f"gen-{self.gen + 1}")
        shutil.rmtree(new, ignore_errors=True)  # a commit that failed half way
        made: set[str] = set()
        for rel, (digest, size, mode) in sorted(manifest.items()):
            src = os.path.join(incoming, digest)
            if not os.path.exists(src):
                src = by_digest.get(digest, "")
            if not src or not os.path.exists(src):
                raise ValueError(f"workspace commit: no content for {rel}")
            dst = os.path.join(new, rel)
            parent = os.path.dirname(dst)
            if parent not in made:
                os.makedirs(parent, mode=0o700, exist_ok=True)
                made.add(parent)
            try:
                os.link(src, dst)
            except OSError:
                shutil.copyfile(src, dst)
            os.chmod(dst, 0o600 | (mode & 0o100))
        with open(os.path.join(new, MANIFEST), "w") as f:
            json.dump({rel: e[0] for rel, e in manifest.items()}, f)
        link = os.path.join(self.root, "current")
        tmp = link + ".tmp"
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(os.path.basename(new), tmp)
        os.replace(tmp, link)  # every file of this sync appears at once
        changed = sorted(r for r, e in manifest.items()
                         if self.current.get(r, [None])[0] != e[0])
        deleted = sorted(set(self.current) - set(manifest))
        self.current, self.gen = manifest, self.gen + 1
        shutil.rmtree(old_gen, ignore_errors=True)
        shutil.rmtree(incoming, ignore_errors=True)
        return {"root": self.root, "gen": self.gen, "changed": len(changed),
                "deleted": len(deleted), "files": len(manifest),
                "bytes": sum(e[1] for e in manifest.values()),
                "names": sorted({r.split("/", 1)[0] for r in manifest})}
