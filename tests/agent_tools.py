"""The two tools and texts of the adapters' agent tests (plain functions; each test wraps them).

``get_weather`` and ``get_local_time`` log every call in ``TOOL_LOG`` and return JSON
for Paris and London; ``QUESTION`` asks for both in Paris after an example turn about
London. :func:`ticking` measures whether the event loop kept running during a call.
"""

# No ``from __future__ import annotations``: LlamaIndex's FunctionTool reads the
# annotations of the functions at run time (a string "Literal[...]" would not resolve).
import asyncio
import json
from collections.abc import Awaitable
from typing import Literal, TypeVar

T = TypeVar("T")

SYSTEM = "You are a helpful assistant that uses tools to answer questions. Be concise and exact."
QUESTION = "And what's the weather like in Paris today, and what time is it there?"

TOOL_LOG: list[tuple[str, dict]] = []


def get_weather(city: str, unit: Literal["celsius", "fahrenheit"] = "celsius") -> str:
    """Get the current weather for a city."""
    TOOL_LOG.append(("get_weather", {"city": city, "unit": unit}))
    temperature = {"Paris": 18, "London": 14}.get(city, 21)
    return json.dumps({"city": city, "temperature": temperature, "unit": unit, "condition": "partly cloudy"})


def get_local_time(city: str) -> str:
    """Get the current local time in a city."""
    TOOL_LOG.append(("get_local_time", {"city": city}))
    return json.dumps({"city": city, "time": {"London": "09:30", "Paris": "10:30"}.get(city, "12:00")})


async def ticking(call: Awaitable[T]) -> tuple[T, int]:
    """Await ``call`` while a ticker task counts 10 ms turns of the event loop.

    A loop blocked by the call ticks once or twice; a free one about every 10 ms.
    """
    ticks = 0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0.01)

    task = asyncio.create_task(ticker())
    try:
        result = await call
    finally:
        done.set()
        await task
    return result, ticks
