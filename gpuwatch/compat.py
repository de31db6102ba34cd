"""What gpuwatch uses from Python 3.11 that 3.10 (Ubuntu 22.04, DGX OS 6) lacks, in one place:
the same names on every supported version, the standard library's where it has them."""

from __future__ import annotations

import asyncio
import sys

if sys.version_info >= (3, 11):
    from asyncio import timeout, timeout_at
    from enum import StrEnum
else:  # pragma: no cover - run by the 3.10 unit tests
    import contextlib
    from collections.abc import AsyncIterator
    from enum import Enum

    import async_timeout

    class StrEnum(str, Enum):
        """An enum whose members are their values as strings, as 3.11's StrEnum."""

        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, spec: str) -> str:
            return str(self.value).__format__(spec)

    # 3.11 made asyncio's TimeoutError the builtin one, which gpuwatch catches.
    @contextlib.asynccontextmanager
    async def _builtin_timeout(limit: async_timeout.Timeout) -> AsyncIterator[None]:
        try:
            async with limit:
                yield
        except asyncio.TimeoutError:
            raise TimeoutError from None

    def timeout(delay: float | None) -> contextlib.AbstractAsyncContextManager[None]:
        return _builtin_timeout(async_timeout.timeout(delay))

    def timeout_at(when: float | None) -> contextlib.AbstractAsyncContextManager[None]:
        return _builtin_timeout(async_timeout.timeout_at(when))


# What a timeout raises, in an `except`: on 3.10 asyncio's TimeoutError (which wait_for
# raises) is not the builtin one; from 3.11 they are the same class.
TIMEOUT_ERRORS: tuple[type[Exception], ...] = (TimeoutError, asyncio.TimeoutError)

__all__ = ["TIMEOUT_ERRORS", "StrEnum", "timeout", "timeout_at"]
