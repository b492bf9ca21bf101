"""Monarch's pytest decorators over settings (`parametrize_config`,
`parametrize_config_pointwise`): a test runs once per combination of values, each under
`configured(...)`. `runtime.config` exposes them, bound to its settings.

Layer 1 (basics): imports nothing of runtime (the settings API it sweeps is passed in).
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Callable, Iterator, Mapping

__all__ = ["SettingSweeps"]


class SettingSweeps:
    """The sweep decorators over one settings API: `configured(**values)` (a context
    manager) runs each case, `resolve(values, where)` checks a value at decoration."""

    def __init__(self, configured: Callable[..., Any],
                 resolve: Callable[[Mapping[str, Any], str], Any]) -> None:
        self._configured = configured
        self._resolve = resolve

    @contextlib.contextmanager
    def _quietly_configured(self, values: dict[str, Any]) -> Iterator[None]:
        """`configured(**values)` without repeating the warnings already given at decoration."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cm = self._configured(**values)
            cm.__enter__()
        try:
            yield
        finally:
            cm.__exit__(None, None, None)


    def _check_sweep(self, settings: Mapping[str, Any], where: str) -> None:
        """Each value list is a collection, and every value one the setting accepts."""
        for key, values in settings.items():
            if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
                raise TypeError(f"{where}({key}=...) takes a collection of values, got {values!r}")
            with warnings.catch_warnings():  # checked here; unmapped names are simply ignored
                warnings.simplefilter("ignore")
                for v in values:
                    self._resolve({key: v}, f"{where}()")


    def _parametrize(self, combos: list[dict[str, Any]]) -> Callable[[Callable], Callable]:
        """A pytest parametrize decorator running the test once per dict, each under `configured`."""
        import functools
        import inspect

        import pytest

        ids = ["-".join(f"{k}={v}" for k, v in c.items()) for c in combos]

        def decorate(fn: Callable) -> Callable:
            wrapper: Callable[..., Any]
            if inspect.iscoroutinefunction(fn):
                async def run_async(*args: Any, _runtime_config: dict, **kwargs: Any) -> Any:
                    with self._quietly_configured(_runtime_config):
                        return await fn(*args, **kwargs)
                wrapper = run_async
            else:
                def run_sync(*args: Any, _runtime_config: dict, **kwargs: Any) -> Any:
                    with self._quietly_configured(_runtime_config):
                        return fn(*args, **kwargs)
                wrapper = run_sync
            functools.update_wrapper(wrapper, fn)
            sig = inspect.signature(fn)
            extra = inspect.Parameter("_runtime_config", inspect.Parameter.KEYWORD_ONLY)
            # what inspect.signature (and so pytest) reads: fn's parameters and the combo's
            setattr(wrapper, "__signature__",
                    sig.replace(parameters=[*sig.parameters.values(), extra]))
            return pytest.mark.parametrize("_runtime_config", combos, ids=ids)(wrapper)

        return decorate


    def product(self, **settings: Any) -> Callable[[Callable], Callable]:
        """Monarch's test decorator: run a pytest test once per combination of the given
        settings' values (`parametrize_config(stop_timeout={1, 5})`), each under `configured`."""
        import itertools

        self._check_sweep(settings, "parametrize_config")
        keys = list(settings)
        return self._parametrize([dict(zip(keys, vals)) for vals in itertools.product(
            *(sorted(settings[k], key=repr) for k in keys))])


    def pointwise(self, **settings: Any) -> Callable[[Callable], Callable]:
        """Monarch's pointwise sweep: run a pytest test once per index of the (equally long)
        value sequences, `parametrize_config_pointwise(a=[1, 2], b=[3, 4])` as (1, 3) and (2, 4)."""
        if not settings:
            raise ValueError("parametrize_config_pointwise requires at least one config option")
        self._check_sweep(settings, "parametrize_config_pointwise")
        lists = {k: list(v) for k, v in settings.items()}
        if len({len(v) for v in lists.values()}) != 1:
            raise ValueError("parametrize_config_pointwise requires every option to have the same "
                             f"number of values; got lengths { {k: len(v) for k, v in lists.items()} }")
        keys = list(lists)
        return self._parametrize([dict(zip(keys, vals)) for vals in zip(*lists.values())])
