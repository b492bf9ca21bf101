"""`runtime.grad_generator(loss, params)`: Monarch's incremental backward. It yields the
gradient of each tensor in `params`, in the order given, as soon as autograd has computed
it, and pauses the backward pass there: the loop body (a `reduce_` of that gradient, say)
is issued before the ops of the next gradients.

How: torch's own autograd engine runs `torch.autograd.grad` in a helper thread; a hook on
each tensor hands its (complete) gradient over. The backward thread runs only while the
loop waits in `next()` for a gradient not yet computed: a hook blocks it once the loop has
what it waits for, or whenever the loop is not waiting (the thread may reach its first hook
before the loop says what it wants). Only one of the two threads issues ops at a time, so
the procs see the backward pass and the loop's ops interleaved in that order."""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator, Optional, Sequence, Union

import torch

__all__ = ["GradGenerator", "grad_generator"]

_JOIN_S = 60.0


class _Abort(Exception):
    """Raised in a hook to stop a backward pass nobody iterates any more."""


class _State:
    """Shared by the iterator and the backward thread (the thread never holds the
    iterator, so dropping the iterator aborts the pass)."""

    def __init__(self, n: int) -> None:
        self.cond = threading.Condition()
        self.grads: list = [None] * n
        self.have = [False] * n
        self.wanted = -1      # the index the loop is waiting for
        self.running = False  # the backward thread may run (the loop waits, or is done)
        self.aborted = False
        self.done = False
        self.error: Optional[BaseException] = None
        self.result: Optional[tuple] = None

    def hook(self, i: int, grad: torch.Tensor) -> None:
        with self.cond:
            if self.aborted:
                raise _Abort()
            self.grads[i], self.have[i] = grad, True
            if i == self.wanted:
                self.running = False  # the loop's body runs now
            self.cond.notify_all()
            while not self.running and not self.aborted:
                self.cond.wait()
            if self.aborted:
                raise _Abort()


def _run(state: _State, roots: list, wrt: list, grad_roots: Optional[list],
         mesh: Any) -> None:
    from ._context import activate

    try:
        with activate(mesh) if mesh is not None else contextlib.nullcontext():
            state.result = torch.autograd.grad(roots, wrt, grad_roots, allow_unused=True)
    except _Abort:
        pass
    except BaseException as e:
        state.error = e
    finally:
        with state.cond:
            state.done = True
            state.running = True
            state.cond.notify_all()


class GradGenerator:
    """The iterator `grad_generator` returns: one gradient per `with_respect_to` tensor, in
    that order (None for a tensor the roots do not depend on)."""

    def __init__(self, roots: list, wrt: list, grad_roots: Optional[list]) -> None:
        self._state = _State(len(wrt))
        self._roots, self._wrt, self._grad_roots = roots, wrt, grad_roots
        self._next = 0
        self._thread: Optional[threading.Thread] = None
        self._handles: list = []

    def __iter__(self) -> "GradGenerator":
        return self

    def _start(self) -> None:
        from ._context import get_active_mesh

        st = self._state
        self._handles = [t.register_hook(lambda g, i=i, st=st: st.hook(i, g))
                         for i, t in enumerate(self._wrt)]
        # the backward pass sees the caller's active mesh, as loss.backward() would
        self._thread = threading.Thread(
            target=_run, args=(st, self._roots, self._wrt, self._grad_roots,
                               get_active_mesh()),
            name="grad-generator", daemon=True)
        self._thread.start()

    def __next__(self) -> Optional[torch.Tensor]:
        st = self._state
        i = self._next
        if i >= len(st.grads):
            self._finish()
            raise StopIteration
        if self._thread is None:
            self._start()
        with st.cond:
            if not st.have[i]:
                st.wanted, st.running = i, True
                st.cond.notify_all()
                while not st.have[i] and not st.done:
                    st.cond.wait()
            if not st.have[i]:  # the pass ended without it: an error, or an unused tensor
                if st.error is not None:
                    err = st.error
                    self._finish()
                    raise err
                st.grads[i] = st.result[i] if st.result is not None else None
            g = st.grads[i]
            st.grads[i] = None  # the caller owns it now
        self._next = i + 1
        return g

    def _finish(self) -> None:
        """Let the backward pass run to its end, remove the hooks, raise its error."""
        st = self._state
        if self._thread is not None:
            with st.cond:
                st.wanted, st.running = -1, True  # to its end, unpaused
                st.cond.notify_all()
            self._thread.join(_JOIN_S)
            self._thread = None
        for h in self._handles:
            h.remove()
        self._handles = []
        if st.error is not None:
            err, st.error = st.error, None
            raise err

    def close(self) -> None:
        """Stop the backward pass where it is (the gradients not yet yielded are dropped)."""
        st = self._state
        with st.cond:
            if not st.done:
                st.aborted = True
            st.cond.notify_all()
        if self._thread is not None:
            self._thread.join(_JOIN_S)
            self._thread = None
        for h in self._handles:
            h.remove()
        self._handles = []

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def grad_generator(roots: Union[torch.Tensor, Sequence[torch.Tensor]] = (),
                   with_respect_to: Sequence[torch.Tensor] = (),
                   grad_roots: Sequence[Optional[torch.Tensor]] = ()) -> Iterator[Any]:
    """Monarch's `grad_generator(loss, params)`: an iterator over the gradients of `params`
    (in the order given: list them last layer first) that yields each one as soon as
    autograd has computed it; `.grad` is not touched."""
    if isinstance(roots, torch.Tensor):
        roots = [roots]
    roots = list(roots)
    wrt = list(with_respect_to)
    if not roots:
        raise ValueError("grad_generator needs a root (the loss)")
    for r in roots:
        if not isinstance(r, torch.Tensor) or not r.requires_grad:
            raise ValueError("grad_generator: the roots must be tensors that require grad "
                             "(was the loss computed under torch.no_grad()?)")
    for i, t in enumerate(wrt):
        if not isinstance(t, torch.Tensor) or not t.requires_grad:
            raise ValueError(f"grad_generator: with_respect_to[{i}] is not a tensor that "
                             "requires grad")
    gr = list(grad_roots) or None
    if gr is not None and len(gr) != len(roots):
        raise ValueError(f"grad_generator: {len(gr)} grad_roots for {len(roots)} roots")
    return GradGenerator(roots, wrt, gr)
