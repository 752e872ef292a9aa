"""Distilling the draft head from its target (``hvd-agents train-drafter``).

* :mod:`.prompts`: templated chat prompts the target answers.
* :mod:`.data`: generating and storing the training samples.
* :mod:`.train`: training and evaluating a head.
* :mod:`.pipeline`: the command's whole run.
"""
