"""The target as a device: loading, kernels, KV cache, the runner, cost profiles, paths.

* :mod:`.paths`: the cache directory.
* :mod:`.loading`: models from a hub id, a local path, a GGUF file or the embedded default.
* :mod:`.kernels` and :mod:`.row_linear`: the CPU linear-layer kernels (dense, packed, row).
* :mod:`.kv`: the in-place KV cache and its rollback and tree compaction.
* :mod:`.hidden`: the target's last-layer hidden states for drafters that read them.
* :mod:`.runner`: the :class:`~.runner.Runner` protocol, the one place the target's forward
  runs, and its implementation over a HuggingFace model.
* :mod:`.quant_runner`, :mod:`.quant_weights`, :mod:`.quant_native`, :mod:`.native_build`: the
  native CPU forward over quantized weights (a GGUF file's own blocks, or int8/int4), the
  runner the engine uses for GGUF models on a CPU.
* :mod:`.profile`: measuring the verification cost profile of a model on this machine.
* :mod:`.runner_choice`: which runner a model gets; :mod:`.target`: the
  :class:`~.target.Target` (model, runner, tokenizer, EOS ids) an engine is built over.
* :mod:`.tree_mask`: tree drafts' ancestors, depths and attention masks as device tensors.

Imports only :mod:`hvd_agents.errors`, :mod:`hvd_agents.structure` and :mod:`hvd_agents.policy`.
"""
