"""Cache drafters: continuations copied from the context and the cross-request store.

* :mod:`.suffix`: the suffix drafter (method ``hvd-cache``, and the cache side of ``hvd``).
* :mod:`.store`: the cross-request store of registered prompt structure and earlier outputs.
* :mod:`.ngram_index`, :mod:`.successors` and :mod:`.history`: the indexes behind both, what followed an
  n-gram in them, and the acceptance history.
* :mod:`.prompt_lookup`: prompt lookup decoding (method ``pld``).
"""
