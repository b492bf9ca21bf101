"""docs/architecture.md's map names every module of the three packages, each once, under
its own package's table (and nothing that is not there)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("runtime", "monarch_kernel", "monarch_widgets")


def mapped() -> dict[str, list[str]]:
    """package dir -> the files its table lists, from the map section."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## The map: every module", 1)[1]
    out: dict[str, list[str]] = {}
    pkg = None
    for line in section.splitlines():
        head = re.match(r"### `([\w/]+)/`", line)
        if head:
            pkg = head.group(1)
            out.setdefault(pkg, [])
            continue
        row = re.match(r"\| `([\w./]+\.py)` \|", line)
        if row and pkg is not None:
            out[pkg].append(row.group(1))
    return out


def present() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for top in PACKAGES:
        for p in (ROOT / top).rglob("*.py"):
            rel = p.relative_to(ROOT)
            pkg = str(rel.parent)
            name = rel.name if pkg != "runtime" else str(rel.relative_to("runtime"))
            out.setdefault(pkg, []).append(name)
    return out


def problems(have: dict[str, list[str]], want: dict[str, list[str]]) -> list[str]:
    """What is wrong with the map `have` against the modules `want`: missing, extra, twice."""
    out = []
    for pkg, files in sorted(want.items()):
        for f in sorted(set(files) - set(have.get(pkg, ()))):
            out.append(f"missing from the map: {pkg}/{f}")
    for pkg, files in sorted(have.items()):
        for f in sorted(set(files) - set(want.get(pkg, ()))):
            out.append(f"on the map but not in the tree: {pkg}/{f}")
        for f in sorted({f for f in files if files.count(f) > 1}):
            out.append(f"listed twice: {pkg}/{f}")
    return out


def test_every_module_is_on_the_map_once():
    have = mapped()
    assert "runtime/proc" in have and "_server.py" in have["runtime/proc"]
    assert problems(have, present()) == []


def test_the_check_reports_a_module_missing_from_the_map():
    want = present()
    want["runtime/_base"] = want["runtime/_base"] + ["new_part.py"]
    have = mapped()
    have["runtime/proc"] = have["runtime/proc"] + ["_server.py", "gone.py"]
    assert problems(have, want) == ["missing from the map: runtime/_base/new_part.py",
                                    "on the map but not in the tree: runtime/proc/gone.py",
                                    "listed twice: runtime/proc/_server.py"]
