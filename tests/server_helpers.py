"""Running the server on a loopback port inside the test process, and tiny engines to serve."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

import openai
import uvicorn

from hvd_agents.engine import Engine
from hvd_agents.server.app import create_app
from hvd_agents.server.config import ServerConfig
from tests.helpers import IM_END_ID

MODEL = "SmolLM2-135M-Instruct"  # the name the server gives the tiny engine's model


@contextlib.contextmanager
def running_server(engine: Engine | None, load: Callable[[], Engine] | None = None, **config) -> Iterator[str]:
    """Serve ``engine`` (or what ``load`` loads) on 127.0.0.1, a free port, in a thread; yields the base URL."""
    app = create_app(ServerConfig(port=0, **config), engine=engine, load=load)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def tiny_engine(model, tokenizer) -> Engine:
    """An engine on the tiny random model, ending at ``<|im_end|>``, without prefix reuse budget limits."""
    return Engine(model, tokenizer, eos_token_ids=(IM_END_ID,))


def client_of(url: str) -> openai.OpenAI:
    """An OpenAI client of the server at ``url`` (no API key, no retries)."""
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
