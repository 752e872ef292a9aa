"""The chat front end: messages and tools in, prompt token ids and parsed replies out.

* :mod:`.render`: rendering messages (and tools) with the model's chat template.
* :mod:`.analyzer`: the prompt-structure analyzer (typed spans, registration in the cache store).
* :mod:`.conversation`: :func:`~.conversation.prepare`, analysing and registering one request's prompt.
* :mod:`.toolcalls`: the tool-call format; :mod:`.toolcall_parser`: the one reader of it, whole or
  in pieces; :mod:`.toolcall_stream`: its streaming face (content and per-call deltas).
* :mod:`.constraints`: a chat call's ``response_format``, tools, ``strict`` and ``tool_choice`` as the
  one grammar its reply is decoded under.
* :mod:`.prompt_templates`: prompt templates tuned for cache reuse (imported as ``.templates``).
* :mod:`.request`: the framework-neutral chat request the integrations adapt, with
  :mod:`.settings`, :mod:`.reply_options` (``tool_choice``, ``response_format``), :mod:`.json_reply`
  and :mod:`.engine_choice`; :mod:`.reply`: where its decoding starts, and its summary;
  :mod:`.delta_stream`: its reply as deltas, the one reply pipeline of the server and both adapters.
* :mod:`.async_stream`: async iteration over the engine's blocking stream.
* :mod:`.template`, :mod:`.templates`: the former names of :mod:`.render` and :mod:`.prompt_templates`.
"""

from hvd_agents.chat.conversation import prepare
from hvd_agents.chat.render import encode_prompt, render_prompt
from hvd_agents.chat.toolcalls import parse_tool_calls

__all__ = ["encode_prompt", "parse_tool_calls", "prepare", "render_prompt"]
