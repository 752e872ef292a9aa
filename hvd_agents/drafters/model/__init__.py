"""Model drafters: tokens proposed from a model's own distribution.

* :mod:`.protocol`: what the ``hvd`` policy needs of a model drafter (:class:`~.protocol.ModelDrafter`).
* :mod:`.loop`: the draft loop every model drafter shares (drawing, stopping, first-token alternatives).
* :mod:`.head`: the EAGLE-style draft head over the target's hidden states.
* :mod:`.draft_lm`: a smaller causal LM with the target's tokenizer.
"""
