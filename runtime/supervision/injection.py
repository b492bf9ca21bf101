"""The rules of `runtime.fault_injection.inject_actor_failures` as plain data: which actor
classes (by `module.QualName`) fail on purpose, how often, and which supervisors handle
only those failures. The controller keeps a stack of the open contexts; a spawn sends the
rules in force with SPAWN_ACTOR, and an actor spawned under them passes them on to the
actors it spawns (so a supervisor in a proc spawns injected workers too).

Layer 1 (basics): imports only `_base`.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

from .._base import context as _context

__all__ = ["push", "pop", "rules_here", "parse"]

#: the open contexts, innermost last: each {"policies": {qcls: [p, s, mode]}, "supervisors":
#: [qcls]}; mode "fail" (the actor fails) or "raise" (its next call raises InjectedFault)
_stack: list[dict] = []
_lock = threading.Lock()


def push(rules: dict) -> None:
    """Open a context's rules (the controller, or any process that enters one)."""
    with _lock:
        _stack.append(rules)


def pop(rules: dict) -> None:
    """Close a context's rules (that one, even when contexts close out of order)."""
    with _lock:
        for i in range(len(_stack) - 1, -1, -1):
            if _stack[i] is rules:
                del _stack[i]
                return


def rules_here() -> Optional[dict]:
    """The rules a spawn from this thread sends: the running actor's (inherited from its
    own spawn), merged under this process's open contexts; None when there are none."""
    inst = _context.current_instance()
    inherited = getattr(inst, "injection", None) if inst is not None else None
    with _lock:
        layers = ([inherited] if inherited else []) + list(_stack)
    if not layers:
        return None
    policies: dict[str, list] = {}
    supervisors: list[str] = []
    for r in layers:  # later (inner) contexts win
        policies.update(r.get("policies") or {})
        supervisors += [s for s in r.get("supervisors") or [] if s not in supervisors]
    return {"policies": policies, "supervisors": supervisors}


def parse(rules: Any) -> Optional[dict]:
    """SPAWN_ACTOR's rules, checked (msgpack data from the spawner): None when absent or
    malformed, so a bad message never fails a spawn."""
    if not isinstance(rules, dict):
        return None
    pol, sup = rules.get("policies"), rules.get("supervisors")
    if not isinstance(pol, dict) or not isinstance(sup, list):
        return None
    out: dict[str, list] = {}
    for k, v in pol.items():
        if (isinstance(k, str) and isinstance(v, (list, tuple)) and len(v) in (2, 3)
                and all(isinstance(x, (int, float)) for x in v[:2]) and 0 <= v[0] <= 1
                and v[1] > 0):
            mode = v[2] if len(v) == 3 and v[2] in ("fail", "raise") else "fail"
            out[k] = [float(v[0]), float(v[1]), mode]
    return {"policies": out, "supervisors": [s for s in sup if isinstance(s, str)]}
