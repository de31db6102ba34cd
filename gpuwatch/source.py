"""The seams between the daemon and what produces samples: a Source for the GPUs (NVML,
dcgm-exporter, ...), a Watcher for what the host tells beside them (the kernel log, sysfs), a
Collector for a component's own state."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

from gpuwatch.model import BackendState, Batch, Sample


class Source(Protocol):
    name: str

    @property
    def backend(self) -> BackendState: ...

    async def start(self) -> None: ...

    async def collect(self) -> Batch:
        """One sampling cycle; returns within the deadline whatever the hardware does."""
        ...

    async def stop(self) -> None: ...


class Collector(Protocol):
    """A component that reports its own state as samples (the notifier's outbox and sends,
    the state directory's failed writes, the rules engine's evaluations), as client_python's
    Collector does: the daemon gathers every one it was handed each cycle, without knowing
    what they are."""

    def collect(self) -> Iterable[Sample]: ...


class Watcher(Protocol):
    """Something the daemon watches beside the GPU backend: the kernel log, sysfs. Read every
    cycle from the first, its samples on a timeline of its own; started once the first cycle
    has listed the GPUs, so that what it follows can be put to a GPU. `read` returns within the
    cycle whatever the host does: its blocking I/O runs off the event loop."""

    name: str

    async def start(self) -> None: ...

    async def read(self) -> list[Sample]: ...

    async def stop(self) -> None: ...


T = TypeVar("T")


def run_into(
    future: concurrent.futures.Future[Any], fn: Callable[..., Any], args: tuple[Any, ...]
) -> None:
    try:
        future.set_result(fn(*args))
    except BaseException as exc:  # handed to the awaiting coroutine, never swallowed
        future.set_exception(exc)


def in_own_thread(name: str, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
    """`fn(*args)` in a daemon thread of its own. For a read that can block for good in the
    kernel (sysfs on a device in trouble): in the loop's executor it would keep the daemon
    from exiting, as the executor waits for its threads at the end."""
    done: concurrent.futures.Future[T] = concurrent.futures.Future()
    threading.Thread(target=run_into, args=(done, fn, args), name=name, daemon=True).start()
    return asyncio.wrap_future(done)
