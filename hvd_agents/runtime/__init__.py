"""The target as a device: loading, kernels, KV cache, the runner, cost profiles, paths.

Two rooms hold the runners, each with its own kernels; the shared modules beside them serve both.

* :mod:`.cpu`: the CPU runner (:class:`~.cpu.runner.QuantRunner`), the native forward over quantized weights (a
  GGUF file's own blocks, or int8/int4), the float32 CPU linear kernels, threads, and the C++ sources.
* :mod:`.static`: the GPU runner (:class:`~.static.runner.StaticRunner`): fixed-shape, graph-captured steps over a
  slot-addressed KV cache.
* :mod:`.runner`: the :class:`~.runner.Runner` protocol, the one place the target's forward runs, and its
  implementation over a HuggingFace model; :mod:`.runner_choice`: which runner a model gets; :mod:`.target`: the
  :class:`~.target.Target` (model, runner, tokenizer, EOS ids) an engine is built over.
* :mod:`.loading`: models from a hub id, a local path, a GGUF file or the embedded default; :mod:`.device`: the
  device and dtype a model is loaded with; :mod:`.weight_cache`: a GGUF file's dequantized float32 copy on disk;
  :mod:`.gguf_file`, :mod:`.gguf_config`, :mod:`.gguf_tokenizer`: a GGUF file read once, its transformers config
  and its tokenizer (for every device); :mod:`.chat_template`, :mod:`.tiktoken_tokenizer`, :mod:`.heap`.
* :mod:`.kv`: the in-place KV cache and its rollback and tree compaction; :mod:`.hidden`: the target's last-layer
  hidden states for drafters that read them; :mod:`.tree_mask`: tree drafts' ancestors, depths and attention
  masks as device tensors; :mod:`.transfer`: host values to the device.
* :mod:`.profile`: measuring the verification cost profile of a model on this machine; :mod:`.paths`: the cache
  directory; :mod:`.progress`: progress lines for long waits.

Imports only :mod:`hvd_agents.errors`, :mod:`hvd_agents.structure` and :mod:`hvd_agents.policy`.
"""
