"""The chat front end: messages and tools in, prompt token ids and parsed replies out.

* :mod:`.template`: rendering messages (and tools) with the model's chat template.
* :mod:`.analyzer`: the prompt-structure analyzer (typed spans, registration in the cache store).
* :mod:`.conversation`: :func:`~.conversation.prepare`, analysing and registering one request's prompt.
* :mod:`.toolcalls` and :mod:`.toolcall_stream`: the tool-call format, parsed whole or while streaming;
  :mod:`.toolcall_deltas`: each call's name and argument text as they are generated.
* :mod:`.templates`: prompt templates tuned for cache reuse.
* :mod:`.request`: the framework-neutral chat request the integrations adapt;
  :mod:`.delta_stream`: its reply as OpenAI-style deltas (what the server streams).
* :mod:`.async_stream`: async iteration over the engine's blocking stream.
"""

from hvd_agents.chat.conversation import prepare
from hvd_agents.chat.render import encode_prompt, render_prompt
from hvd_agents.chat.toolcalls import parse_tool_calls

__all__ = ["encode_prompt", "parse_tool_calls", "prepare", "render_prompt"]
