"""The CPU runner's room: the native forward over quantized weights, its kernels and their C++ sources.

* :mod:`.runner`: :class:`~.runner.QuantRunner`, the :class:`~hvd_agents.runtime.runner.Runner` the engine uses
  for GGUF (and int8/int4) models on a CPU, and :class:`~.runner.NativeModel`, a model's weights in the native
  forward.
* :mod:`.arch`: what the native forward computes for each decoder family; :mod:`.weights`: a model's matrices in
  the native formats (a GGUF file's blocks as :mod:`.gguf_blocks` and :mod:`.gguf_iq_blocks` convert them, or
  int8/int4); :mod:`.loading`: a GGUF file put on the native forward alone;
  :mod:`.embedding_file`: a GGUF file's embedding table memory-mapped as float32.
* :mod:`.native_forward`: ``native/quant_forward.cpp`` built once per instruction-set path and chosen at run time;
  :mod:`.native_build`: building and loading a native kernel once per build key; ``native/``: the C++ sources.
* :mod:`.quant_linear`: a draft head's linear layers on the native int8 kernel; :mod:`.kernels`,
  :mod:`.row_linear` and :mod:`.packed_linear`: the float32 linear-layer kernels (dense, row, packed) of a model
  that runs its own forward on a CPU.
* :mod:`.threads`: threads on the CPU hot path (the native forward's team, torch's small ops beside it).

Importing this package imports none of its modules: each is imported where it is used.
"""
