"""Structured requests to a paused actor (the Jupyter Debugger panel's stack, scopes,
variables and evaluate), answered on the actor's thread from its RemotePdb.

Frames are numbered by their index in pdb's stack; variable references are small ints valid
for this stop only (`chan.refs`, cleared when pdb runs again). Values are summarised, never
pulled whole: torch tensors and numpy arrays by shape, dtype and device with a few values
(CPU only), other objects by a bounded repr. Everything returned is msgpack-able.
"""

from __future__ import annotations

import io
import reprlib
import traceback
from contextlib import redirect_stdout
from typing import Any

MAX_CHILDREN = 100
FEW_VALUES = 6
_repr = reprlib.Repr()
_repr.maxstring = 120
_repr.maxother = 120
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 8


def _is_tensor(v: Any) -> bool:
    return type(v).__module__.startswith("torch") and hasattr(v, "dtype") and \
        hasattr(v, "shape") and hasattr(v, "device")


def _is_ndarray(v: Any) -> bool:
    return type(v).__module__ == "numpy" and type(v).__name__ == "ndarray"


def _few(v: Any) -> str:
    try:
        flat = v.reshape(-1)[:FEW_VALUES]
        vals = flat.tolist()
        more = ", ..." if v.size > FEW_VALUES else ""
        return "[" + ", ".join(f"{x:.4g}" if isinstance(x, float) else str(x)
                               for x in vals) + more + "]"
    except Exception:  # noqa: BLE001
        return "[?]"


def summarize(v: Any) -> tuple[str, str]:
    """(value text, type name) of `v`, bounded; tensors and arrays by metadata."""
    tname = type(v).__name__
    try:
        if isinstance(v, _Text):
            return str(v), "str"
        if _is_tensor(v):
            shape = tuple(int(x) for x in v.shape)
            dtype = str(v.dtype).replace("torch.", "")
            head = f"tensor(shape={shape}, dtype={dtype}, device={v.device})"
            if v.device.type == "cpu" and not getattr(v, "is_meta", False):
                head += " " + _few(v.detach().cpu().numpy() if dtype != "bfloat16"
                                   else v.detach().float().numpy())
            return head, "Tensor"
        if _is_ndarray(v):
            return f"ndarray(shape={tuple(v.shape)}, dtype={v.dtype}) {_few(v)}", tname
        return _repr.repr(v), tname
    except Exception as e:  # noqa: BLE001 - a broken __repr__ must not break the panel
        return f"<{tname}: repr failed: {type(e).__name__}>", tname


class _Text(str):
    """A summary line shown as it is (not as a string's repr)."""


def _children(v: Any) -> list[tuple[str, Any]]:
    """The expandable parts of `v`: dict items, sequence items, attributes."""
    if _is_tensor(v):
        out = [("shape", _Text(tuple(int(x) for x in v.shape))),
               ("dtype", _Text(str(v.dtype).replace("torch.", ""))),
               ("device", _Text(v.device)), ("requires_grad", bool(v.requires_grad))]
        if v.device.type == "cpu":
            out.append(("values", _Text(summarize(v)[0].split(") ", 1)[-1])))
        return out
    if _is_ndarray(v):
        return [("shape", _Text(tuple(v.shape))), ("dtype", _Text(v.dtype)),
                ("values", _Text(_few(v)))]
    if isinstance(v, dict):
        return [(repr(k) if not isinstance(k, str) else k, x)
                for k, x in list(v.items())[:MAX_CHILDREN]]
    if isinstance(v, (list, tuple)):
        return [(str(i), x) for i, x in enumerate(v[:MAX_CHILDREN])]
    if isinstance(v, (set, frozenset)):
        return [(str(i), x) for i, x in enumerate(list(v)[:MAX_CHILDREN])]
    d = getattr(v, "__dict__", None)
    if isinstance(d, dict):
        return [(k, x) for k, x in list(d.items())[:MAX_CHILDREN] if not k.startswith("__")]
    return []


_LEAVES = (type(None), bool, int, float, complex, str, bytes)


def _expandable(v: Any) -> bool:
    if isinstance(v, _LEAVES) or callable(v) and not isinstance(v, type):
        return False
    if type(v).__name__ == "module":
        return False
    if _is_tensor(v) or _is_ndarray(v):
        return True
    if isinstance(v, (dict, list, tuple, set, frozenset)):
        return len(v) > 0
    return isinstance(getattr(v, "__dict__", None), dict)


def _ref(chan: Any, v: Any) -> int:
    if not _expandable(v):
        return 0
    ref = len(chan.refs) + 1
    chan.refs[ref] = v
    return ref


def variable(chan: Any, name: str, v: Any) -> dict:
    """One DAP variable: name, value summary, type, variablesReference (0: a leaf)."""
    text, tname = summarize(v)
    return {"name": str(name), "value": text, "type": tname,
            "variablesReference": _ref(chan, v)}


def _frame(p: Any, index: Any) -> tuple[Any, int]:
    i = p.curindex if index is None else int(index)
    if not 0 <= i < len(p.stack):
        raise IndexError(f"no frame {i} (the stack has {len(p.stack)})")
    return p.stack[i][0], i


def _stack(p: Any) -> dict:
    frames = []
    for i in range(len(p.stack) - 1, -1, -1):
        f, lineno = p.stack[i]
        frames.append({"index": i, "name": f.f_code.co_name, "file": f.f_code.co_filename,
                       "line": int(lineno)})
    return {"frames": frames, "current": int(p.curindex)}


def _scopes(chan: Any, p: Any, args: dict) -> dict:
    f, i = _frame(p, args.get("frame"))
    loc = p.curframe_locals if i == p.curindex else f.f_locals
    scopes = []
    for name, mapping in (("Locals", loc), ("Globals", f.f_globals)):
        ref = len(chan.refs) + 1
        chan.refs[ref] = _Scope(mapping)
        scopes.append({"name": name, "variablesReference": ref, "expensive": False})
    return {"scopes": scopes}


class _Scope:
    """A frame's locals or globals (modules and dunders left out of Globals)."""

    def __init__(self, mapping: dict) -> None:
        self.mapping = mapping

    def items(self) -> list[tuple[str, Any]]:
        return [(k, v) for k, v in self.mapping.items()
                if not (k.startswith("__") and k.endswith("__"))
                and type(v).__name__ != "module"][: 4 * MAX_CHILDREN]


def _variables(chan: Any, args: dict) -> dict:
    ref = int(args.get("ref", 0))
    if ref not in chan.refs:
        raise KeyError(f"variable reference {ref} is stale (the actor ran on)")
    v = chan.refs[ref]
    items = v.items() if isinstance(v, _Scope) else _children(v)
    return {"variables": [variable(chan, k, x) for k, x in items]}


def _evaluate(chan: Any, p: Any, args: dict) -> dict:
    f, i = _frame(p, args.get("frame"))
    loc = p.curframe_locals if i == p.curindex else f.f_locals
    expr = str(args.get("expression", ""))
    try:
        code = compile(expr, "<debug console>", "eval")
    except SyntaxError:
        out = io.StringIO()
        with redirect_stdout(out):  # a statement, as pdb's default command runs it
            exec(compile(expr, "<debug console>", "single"), f.f_globals, loc)
        return {"result": out.getvalue().rstrip("\n"), "type": "", "variablesReference": 0}
    out = io.StringIO()
    with redirect_stdout(out):  # what it prints is part of the answer
        v = eval(code, f.f_globals, loc)
    printed = out.getvalue().rstrip("\n")
    if v is None and printed:
        return {"result": printed, "type": "", "variablesReference": 0}
    var = variable(chan, expr, v)
    return {"result": (printed + "\n" if printed else "") + var["value"], "type": var["type"],
            "variablesReference": var["variablesReference"]}


def answer(chan: Any, command: str, args: dict) -> dict:
    """{"ok": bool, "body": {...}, "message": str} for one request to the paused `chan`."""
    p = chan.pdb
    try:
        if p is None or not getattr(p, "stack", None):
            raise RuntimeError("the actor is not stopped in a frame")
        if command == "stackTrace":
            body = _stack(p)
        elif command == "scopes":
            body = _scopes(chan, p, args)
        elif command == "variables":
            body = _variables(chan, args)
        elif command == "evaluate":
            body = _evaluate(chan, p, args)
        else:
            raise ValueError(f"unsupported request {command!r}")
        return {"ok": True, "body": body, "message": ""}
    except BaseException as e:  # noqa: BLE001 - the answer says what failed
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        msg = "".join(traceback.format_exception_only(type(e), e)).strip()
        return {"ok": False, "body": {}, "message": msg[:2000]}


__all__ = ["answer", "summarize", "variable"]
