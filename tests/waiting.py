"""Waiting in tests: poll a condition until it holds. The one helper every test uses (issue 36).

``timeout`` is an upper bound that only catches a hang: a test never asserts how soon a condition
held, so a loaded machine changes how long a test takes, never its verdict. The condition may
itself fail at once (an ``assert`` inside it, e.g. "the process under test exited"), which ends the
wait with that failure instead of waiting out the timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def _timed_out(timeout: float, message: str, last: Any, explain: Callable[[], str] | None) -> AssertionError:
    text = f"timed out after {timeout:g} s waiting for {message}; last: {last!r}"[:3000]
    return AssertionError(text + (f"\n{explain()}" if explain is not None else ""))


def wait_until(
    condition: Callable[[], T],
    *,
    timeout: float,
    message: str,
    interval: float = 0.1,
    retry_on: tuple[type[Exception], ...] = (),
    explain: Callable[[], str] | None = None,
) -> T:
    """Call ``condition`` every ``interval`` seconds until it returns something truthy; return that.

    After ``timeout`` seconds fail with an :class:`AssertionError` naming ``message`` and the last
    value seen (plus ``explain()``, e.g. a log tail). An exception of a type in ``retry_on`` (an
    API hiccup) counts as "not yet"; any other exception ends the wait.
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            value = condition()
        except retry_on as exc:
            last = exc
        else:
            if value:
                return value
            last = value
        if time.monotonic() >= deadline:
            raise _timed_out(timeout, message, last, explain)
        time.sleep(interval)


async def wait_until_async(
    condition: Callable[[], T],
    *,
    timeout: float,
    message: str,
    interval: float = 0.05,
    explain: Callable[[], str] | None = None,
) -> T:
    """:func:`wait_until` for a test running on an event loop: the loop keeps running while it waits."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        last = condition()
        if last:
            return last
        if loop.time() >= deadline:
            raise _timed_out(timeout, message, last, explain)
        await asyncio.sleep(interval)
