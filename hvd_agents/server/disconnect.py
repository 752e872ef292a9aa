"""A client that goes away cancels what the server awaits for it.

:func:`until_disconnect` awaits a coroutine while watching the request's ASGI
``receive`` for ``http.disconnect``; when the client leaves first, the coroutine's
task is cancelled (for a generation: its cancel flag is set, and the engine stops
after the current step) and :class:`ClientGone` is raised. This covers a
non-streamed request waiting for its reply and any request waiting in the queue;
a streamed reply is cancelled the same way by Starlette's own watch of the stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


async def _disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """The result of ``work``, unless the client disconnects first.

    Raises:
        ClientGone: the client disconnected; ``work`` was cancelled and has ended.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
    if task.cancelled():
        raise ClientGone()
    return task.result()
