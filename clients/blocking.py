"""Blocking facades over asyncio objects: every method written once, as a coroutine, and called from threads.

A facade holds its async `_target` and a `_portal`, anyio's blocking portal into an event loop that runs
on a private daemon thread (`start_blocking_portal`). Its methods are declared from the target's:

    class Client:
        info = blocking(AsyncClient.info)            # Client.info(...) runs AsyncClient.info(...)
        episode = blocking_context(AsyncClient.episode, Episode)
        base_url = mirrored[str]()                   # reads AsyncClient's base_url

`blocking` keeps the method's parameters (ParamSpec), so type checkers and IDEs see the real signature.
Calls from any number of threads run concurrently on the one loop, so a facade is thread-safe wherever
its target is safe to share between tasks.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from typing import Concatenate, Generic, ParamSpec, Protocol, TypeVar, overload

from anyio.from_thread import BlockingPortal

__all__ = ["Facade", "blocking", "blocking_context", "mirrored"]

P = ParamSpec("P")
T = TypeVar("T")
Inner = TypeVar("Inner")
Target = TypeVar("Target")
Target_co = TypeVar("Target_co", covariant=True)


class Facade(Protocol[Target_co]):
    """A blocking object that runs the coroutines of `_target` through `_portal`."""

    @property
    def _portal(self) -> BlockingPortal: ...

    @property
    def _target(self) -> Target_co: ...


def blocking(
    method: Callable[Concatenate[Target, P], Awaitable[T]],
) -> Callable[Concatenate[Facade[Target], P], T]:
    """The blocking twin of an async method: it runs the coroutine on the facade's loop and waits for it."""

    def call(self: Facade[Target], /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._portal.call(functools.partial(method, self._target, *args, **kwargs))

    functools.update_wrapper(call, method)
    return call


def blocking_context(
    method: Callable[Concatenate[Target, P], AbstractAsyncContextManager[Inner]],
    wrap: Callable[[BlockingPortal, Inner], T],
) -> Callable[Concatenate[Facade[Target], P], contextlib.AbstractContextManager[T]]:
    """The blocking twin of an async context manager method; what it yields is handed out as
    `wrap(portal, inner)`, a facade of its own. An exception in the block reaches the async `__aexit__`."""

    @contextlib.contextmanager
    def enter(self: Facade[Target], /, *args: P.args, **kwargs: P.kwargs) -> Iterator[T]:
        with self._portal.wrap_async_context_manager(method(self._target, *args, **kwargs)) as inner:
            yield wrap(self._portal, inner)

    functools.update_wrapper(enter, method)
    return enter


class mirrored(Generic[T]):
    """A read-only attribute of a facade that reads the attribute of the same name of its target (named in
    lower case, as `property` is)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, facade: None, owner: type) -> mirrored[T]: ...

    @overload
    def __get__(self, facade: object, owner: type) -> T: ...

    def __get__(self, facade: object, owner: type) -> T | mirrored[T]:
        if facade is None:
            return self
        value: T = getattr(facade._target, self.name)  # type: ignore[attr-defined]
        return value
