"""The benchmark actor for Monarch (importable by its workers)."""

from monarch.actor import Actor, endpoint


class Bench(Actor):
    @endpoint
    def noop(self):
        return None

    @endpoint
    def nbytes(self, a):
        return a.nbytes if hasattr(a, "nbytes") else a.numel() * a.element_size()
