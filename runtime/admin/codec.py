"""JSON encoding of health snapshots, for the admin endpoint (never pickle)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from runtime.supervision.health import ActorHealth, ActorState, MeshHealth, ProcStats

__all__ = ["encode_snapshot", "decode_snapshot"]


def encode_snapshot(snapshot: list[MeshHealth]) -> list[dict[str, Any]]:
    """Plain JSON-able dicts for a list of MeshHealth."""
    out = []
    for m in snapshot:
        d = asdict(m)
        for a in d["actors"]:
            a["state"] = ActorState(a["state"]).value
        out.append(d)
    return out


def decode_snapshot(data: Any) -> list[MeshHealth]:
    """Rebuild MeshHealth objects from `encode_snapshot` output; raises ValueError if malformed."""
    if not isinstance(data, list):
        raise ValueError("snapshot must be a list")
    out = []
    try:
        for m in data:
            actors = tuple(
                ActorHealth(**{**a, "state": ActorState(a["state"]),
                               "coords": {str(k): int(v) for k, v in a["coords"].items()}})
                for a in m["actors"])
            procs = tuple(ProcStats(**p) for p in m.get("procs", ()))
            out.append(MeshHealth(name=m["name"], proc_mesh=m["proc_mesh"],
                                  sizes={str(k): int(v) for k, v in m["sizes"].items()},
                                  actors=actors, procs=procs,
                                  internal=bool(m.get("internal", False)),
                                  keep=float(m.get("keep") or 0.0),
                                  reattached=(None if m.get("reattached") is None
                                              else float(m["reattached"]))))
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"malformed snapshot: {e}") from None
    return out
