"""Fixtures of the llama-index-llms-hvd tests: the repository's shared fixtures, imported from tests/conftest.py.

``real_engine`` is ``shared_engine(None, device="cpu")``, the process-wide engine on the
embedded SmolLM2-135M-Instruct: one load per pytest session, whichever test folder
asks first (the LangChain adapter's tests get the same engine).
``scripted``, ``fixed_call_ids``, ``tiny_model`` and ``byte_tokenizer`` need no real model.
The helpers come from the repository root (``pythonpath = ["."]`` in pyproject.toml).
"""

from tests.conftest import byte_tokenizer, fixed_call_ids, real_engine, scripted, tiny_model

__all__ = ["byte_tokenizer", "fixed_call_ids", "real_engine", "scripted", "tiny_model"]
