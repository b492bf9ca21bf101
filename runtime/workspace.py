"""Monarch's `Workspace`: the local directories `HostMesh.sync_workspace` copies to every
host, and the scan that lists their files by content hash.

Layer 1 (basics): reads the local file system, sends nothing. What is left out: `.git`,
`__pycache__`, virtual environments (a directory holding `pyvenv.cfg`, or named `.venv`),
and what the `.gitignore` files of the tree ignore. Files are identified by the SHA-256 of
their content, never by their mtime: an edit that keeps size and mtime is still seen.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

__all__ = [
    "PathLike", "EXCLUDED_DIRS", "MANIFEST", "WorkspaceError", "WorkspaceTooLarge", "Workspace",
    "FileEntry", "Scan", "file_digest", "scan", "module_rel",
]

PathLike = Union[str, "os.PathLike[str]"]

#: directory names never copied
EXCLUDED_DIRS = frozenset({".git", "__pycache__", ".venv", ".hg", ".svn", ".mypy_cache",
                           ".pytest_cache", ".ipynb_checkpoints"})
#: the name of the manifest each synced generation carries (not importable: a dot name)
MANIFEST = ".manifest.json"


class WorkspaceError(Exception):
    """A workspace that cannot be synced (a missing directory, two with one name)."""


class WorkspaceTooLarge(WorkspaceError):
    """The workspace is over the size cap; the message names its largest files."""


@dataclass
class Workspace:
    """Monarch's `Workspace(dirs=[...])`: local directories to sync to every host. `dirs`
    is a list of directories (each lands on the hosts under its own name) or a dict
    {local directory: name on the hosts}. `env` is Monarch's conda environment: only None
    is supported here (sync the code, not an interpreter)."""

    dirs: Any = None
    env: Any = None

    def __post_init__(self) -> None:
        if self.env is not None:
            raise NotImplementedError("Workspace(env=...): syncing an environment (conda) is "
                                      "not supported; install packages on the hosts instead")

    @staticmethod
    def null() -> "Workspace":
        """An empty workspace (Monarch's `Workspace.null()`)."""
        return Workspace(dirs=[])

    def targets(self) -> dict[str, Path]:
        """{name on the hosts: local directory (absolute)}; WorkspaceError if a directory is
        missing or two share a name."""
        items: list[tuple[Path, str]] = []
        if isinstance(self.dirs, dict):
            items = [(Path(k), str(v)) for k, v in self.dirs.items()]
        elif self.dirs is not None:
            dirs = [self.dirs] if isinstance(self.dirs, (str, os.PathLike)) else self.dirs
            items = [(Path(d), "") for d in dirs]
        out: dict[str, Path] = {}
        for local, name in items:
            local = local.expanduser().resolve()
            if local.is_file():
                raise WorkspaceError(f"workspace directory {local} is a file, not a "
                                     f"directory: sync the directory that holds it "
                                     f"({local.parent})")
            if not local.is_dir():
                raise WorkspaceError(f"workspace directory {local} does not exist")
            name = name.strip("/") or local.name
            if not name or name.startswith(".") or "/" in name or name in ("..",):
                raise WorkspaceError(f"workspace name {name!r} (for {local}): use a plain "
                                     "directory name")
            if name in out:
                raise WorkspaceError(f"two workspace directories land on one name {name!r}: "
                                     f"{out[name]} and {local}; name them with a dict "
                                     "{directory: name} (Workspace(dirs={...}))")
            out[name] = local
        return out


@dataclass
class FileEntry:
    """One file of a scanned workspace."""

    rel: str  # "<name>/<path inside the directory>"
    path: Path  # the local file
    size: int
    mode: int  # permission bits
    digest: str  # SHA-256 of the content, hex


@dataclass
class Scan:
    """A workspace as listed by `scan`: its files (by "<name>/<path>") and directories."""

    targets: dict[str, Path]
    files: dict[str, FileEntry] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files.values())

    def manifest(self) -> dict[str, list]:
        """{rel: [digest, size, mode]}: what the hosts are asked to hold."""
        return {r: [f.digest, f.size, f.mode] for r, f in self.files.items()}


class _Ignore:
    """The patterns of the .gitignore files on the way down to a directory."""

    def __init__(self, rules: tuple = ()) -> None:
        self.rules = rules  # (base rel dir, regex, negated, dir_only)

    def child(self, base: str, directory: Path) -> "_Ignore":
        gi = directory / ".gitignore"
        if not gi.is_file():
            return self
        try:
            lines = gi.read_text(errors="replace").splitlines()
        except OSError:
            return self
        return _Ignore(self.rules + tuple(r for r in (_rule(base, ln) for ln in lines) if r))

    def ignored(self, rel: str, is_dir: bool) -> bool:
        out = False
        for base, rx, neg, dir_only in self.rules:
            if dir_only and not is_dir:
                continue
            if base and not rel.startswith(base + "/"):
                continue
            if rx.match(rel[len(base) + 1:] if base else rel):
                out = not neg
        return out


def _rule(base: str, line: str) -> Optional[tuple]:
    """One .gitignore line as (base, regex over the path below base, negated, dir only)."""
    line = line.rstrip()
    if not line or line.startswith("#"):
        return None
    neg = line.startswith("!")
    if neg:
        line = line[1:]
    dir_only = line.endswith("/")
    line = line.strip("/") if dir_only else line
    anchored = "/" in line.rstrip("/")
    line = line.lstrip("/")
    parts = []
    i = 0
    while i < len(line):
        if line.startswith("**/", i):
            parts.append("(?:.*/)?")
            i += 3
        elif line.startswith("/**", i) and i + 3 == len(line):
            parts.append("/.*")
            i += 3
        elif line[i] == "*":
            parts.append("[^/]*")
            i += 1
        elif line[i] == "?":
            parts.append("[^/]")
            i += 1
        elif line[i] == "[":
            j = line.find("]", i)
            if j < 0:
                parts.append(re.escape(line[i]))
                i += 1
            else:
                parts.append(fnmatch.translate(line[i:j + 1])[4:-3])
                i = j + 1
        else:
            parts.append(re.escape(line[i]))
            i += 1
    body = "".join(parts)
    prefix = "" if anchored else "(?:.*/)?"
    return base, re.compile(f"^{prefix}{body}(?:/.*)?$", re.S), neg, dir_only


def _is_venv(d: Path) -> bool:
    return (d / "pyvenv.cfg").is_file() or (d / "conda-meta").is_dir()


def file_digest(path: Path) -> str:
    """The SHA-256 of a file's content (hex)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                return h.hexdigest()
            h.update(chunk)


def scan(workspace: Workspace, max_bytes: int) -> Scan:
    """List the workspace's files with their content hashes, leaving out `.git`,
    `__pycache__`, virtual environments and `.gitignore`'d paths. WorkspaceTooLarge (naming
    the largest files) when they add up to more than `max_bytes`."""
    out = Scan(workspace.targets())
    for name, root in out.targets.items():
        _walk(out, name, root, "", _Ignore().child("", root))
    total = out.total_bytes
    if total > max_bytes:
        big = sorted(out.files.values(), key=lambda f: -f.size)[:5]
        names = ", ".join(f"{f.path} ({_mb(f.size)})" for f in big)
        raise WorkspaceTooLarge(
            f"the workspace holds {_mb(total)} in {len(out.files)} files, over the cap of "
            f"{_mb(max_bytes)} (MONARCH_WORKSPACE_MAX_BYTES); the largest: {names}. Leave "
            "data and checkpoints out with a .gitignore, or raise the cap")
    return out


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _walk(out: Scan, name: str, directory: Path, rel: str, ignore: _Ignore) -> None:
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError as err:
        raise WorkspaceError(f"cannot read workspace directory {directory}: {err}") from None
    for e in entries:
        r = f"{rel}/{e.name}" if rel else e.name
        try:
            st = e.stat()  # follows links: a linked file is copied as a file
        except OSError:
            continue  # a dangling link
        if stat.S_ISDIR(st.st_mode):
            p = Path(e.path)
            if e.name in EXCLUDED_DIRS or _is_venv(p) or ignore.ignored(r, True) or \
                    e.is_symlink():
                continue
            _walk(out, name, p, r, ignore.child(r, p))
        elif stat.S_ISREG(st.st_mode):
            if e.name.endswith((".pyc", ".pyo")) or ignore.ignored(r, False):
                continue
            out.files[f"{name}/{r}"] = FileEntry(f"{name}/{r}", Path(e.path), st.st_size,
                                                 stat.S_IMODE(st.st_mode) & 0o755,
                                                 file_digest(Path(e.path)))


def module_rel(filename: str, roots: dict[str, str]) -> Optional[str]:
    """The workspace path ("<name>/<path>") of a module file under one of `roots`
    ({name: directory}), or None."""
    for name, root in roots.items():
        root = root.rstrip("/") + "/"
        if filename.startswith(root):
            return f"{name}/{filename[len(root):]}"
    return None
