"""Cache drafters: continuations copied from the context and the cross-request store.

* :mod:`.suffix`: the suffix drafter (method ``hvd-cache``, and the cache side of ``hvd``).
* :mod:`.store`: the cross-request store of registered prompt structure and earlier outputs.
* :mod:`.ngram_index` and :mod:`.history`: the indexes behind both.
* :mod:`.prompt_lookup`: prompt lookup decoding (method ``pld``).
"""
