"""docs/porting.md's tables against Monarch's public names (docs/monarch_public_names.txt,
the `__all__` of each module at one Monarch commit) and against this runtime's modules.

Pure: reads two files and imports the runtime's modules; starts no process."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("same", "alias", "differs", "not provided")


def kept_names(text: str) -> tuple[str, dict[str, set[str]]]:
    """(commit, {monarch module: its public names}) from the kept list's text."""
    commit, modules, current = "", {}, None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("commit:"):
            commit = line.split(":", 1)[1].strip()
        elif line.startswith("[") and line.endswith("]"):
            current = modules.setdefault(line[1:-1], set())
        else:
            assert current is not None and re.fullmatch(r"[A-Za-z_]\w*", line), line
            assert line not in current, f"{line} twice in one module"
            current.add(line)
    return commit, modules


def porting_tables(text: str) -> dict[str, tuple[str, list[tuple[list[str], str, str]]]]:
    """{monarch module: (runtime module, rows)} from porting.md, one row a (names, kind,
    notes); rows whose first cell is in parentheses (names outside `__all__`) are left out."""
    tables = {}
    current = None
    for line in text.splitlines():
        m = re.match(r"## `(monarch[\w.]*)`.*→ `(runtime[\w.]*)`", line)
        if m:
            current = tables.setdefault(m.group(1), (m.group(2), []))[1]
            continue
        if line.startswith("## "):
            current = None
        if current is None or not line.startswith("| ") or line.startswith("| Monarch name"):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if cells[0].startswith("("):
            continue
        names = [re.match(r"\w+", n).group(0) for n in re.findall(r"`([^`]+)`", cells[0])]
        current.append((names, cells[1], cells[2] if len(cells) > 2 else ""))
    return tables


def table_problems(kept: dict[str, set[str]], tables: dict) -> list[str]:
    """What is wrong between the kept names and the tables (empty when they agree)."""
    problems = []
    for module, names in kept.items():
        if module not in tables:
            problems.append(f"porting.md has no table for {module}")
            continue
        listed = [n for row_names, _, _ in tables[module][1] for n in row_names]
        for n in sorted(names - set(listed)):
            problems.append(f"{module}.{n} is not in porting.md")
        for n in sorted(set(listed) - names):
            problems.append(f"{module}.{n} is listed but not among Monarch's public names")
        for n in sorted({n for n in listed if listed.count(n) > 1}):
            problems.append(f"{module}.{n} is listed more than once")
    for module in sorted(set(tables) - set(kept)):
        problems.append(f"porting.md has a table for {module}, which the kept list lacks")
    return problems


@pytest.fixture(scope="module")
def kept() -> tuple[str, dict[str, set[str]]]:
    return kept_names((ROOT / "docs" / "monarch_public_names.txt").read_text())


@pytest.fixture(scope="module")
def tables() -> dict:
    return porting_tables((ROOT / "docs" / "porting.md").read_text())


def test_every_kept_name_is_listed_once_and_nothing_else(kept, tables):
    assert table_problems(kept[1], tables) == []


def test_the_check_fails_when_a_name_is_removed_from_the_kept_list_or_added_to_it(kept, tables):
    removed = {m: set(names) for m, names in kept[1].items()}
    removed["monarch.actor"].discard("attach")
    assert table_problems(removed, tables) == [
        "monarch.actor.attach is listed but not among Monarch's public names"]
    added = {m: set(names) for m, names in kept[1].items()}
    added["monarch.job"].add("brand_new_name")
    assert table_problems(added, tables) == ["monarch.job.brand_new_name is not in porting.md"]


def test_the_doc_names_the_commit_of_the_kept_list(kept):
    commit, modules = kept
    assert re.fullmatch(r"[0-9a-f]{40}", commit)
    assert commit[:12] in (ROOT / "docs" / "porting.md").read_text()
    assert {"monarch", "monarch.actor", "monarch.job", "monarch.config", "monarch.rdma",
            "monarch.spmd"} == set(modules)


def test_each_row_says_what_the_name_is_here(tables):
    for module, (_, rows) in tables.items():
        for names, kind, notes in rows:
            assert names, f"a row of {module} names nothing"
            assert kind in KINDS, f"{module} {names}: {kind!r} is not one of {KINDS}"
            if kind != "same":
                assert notes, f"{module} {names} ({kind}) says nothing of what or why"


def test_same_names_exist_here_and_not_provided_ones_do_not(tables):
    for module, (ours, rows) in tables.items():
        mod = importlib.import_module(ours)
        for names, kind, _ in rows:
            for n in names:
                if kind in ("same", "differs"):
                    assert hasattr(mod, n), f"porting.md: {module}.{n} is {kind} but {ours}.{n} is missing"
                elif kind == "not provided":
                    assert not hasattr(mod, n), f"porting.md: {module}.{n} is not provided but {ours}.{n} exists"
