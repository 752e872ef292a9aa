"""LangChain integration of hvd-agents: ``from langchain_hvd import ChatHVD``."""

from langchain_hvd.chat_models import ChatHVD

__version__ = "0.1.0"

__all__ = ["ChatHVD", "__version__"]
