"""LlamaIndex LLM for hvd-agents: ``from llama_index.llms.hvd import HVD``."""

from llama_index.llms.hvd.base import HVD

__all__ = ["HVD"]
