#!/usr/bin/env bash
# The GPU checks in one run, each stage under a share of one deadline:
#   bash scripts/gpu_run.sh [tests|probe|probe-small|probe-8b|bench-small|bench-8b ...]
#   (default: tests probe bench-small bench-8b; probe-small and probe-8b: one configuration each, with
#   PROBE_MODES_SMALL / PROBE_MODES_8B as its PROBE_MODES, see scripts/gpu_probe.py)
# Logs go to $OUT (or gpu-logs/). PROMPTS names a JSON list of token-id prompts for bench-gpu.
set -u
LOGS=${OUT:-gpu-logs}; mkdir -p "$LOGS"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
DEADLINE=$((SECONDS + ${BUDGET_S:-540}))
PROMPTS=${PROMPTS:-}
run() {  # run LIMIT NAME CMD...: at most LIMIT seconds, never past the deadline
  local limit=$1 name=$2; shift 2
  local left=$((DEADLINE - SECONDS)); ((left < limit)) && limit=$left
  if ((limit < 10)); then echo "== $name: skipped, no time left"; return; fi
  echo "== $name (at most ${limit}s)"; local t0=$SECONDS
  timeout "$limit" "$@" >"$LOGS/$name.log" 2>&1; local rc=$?
  tail -n "${TAIL:-40}" "$LOGS/$name.log"; echo "== $name: rc=$rc in $((SECONDS - t0))s"
}
prompt_args=(); [[ -n $PROMPTS ]] && prompt_args=(--prompts "$PROMPTS")
stages=("$@"); ((${#stages[@]})) || stages=(tests probe bench-small bench-8b)
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -c 'import torch, transformers, triton; print("torch", torch.__version__, "transformers", transformers.__version__, "triton", triton.__version__)'
for stage in "${stages[@]}"; do
  case $stage in
    tests) run "${LIMIT_TESTS:-220}" tests python3 -m pytest -q -rA -s -p no:cacheprovider --timeout 200 \
             tests/test_gpu_runner.py tests/test_device_verify.py ;;
    probe) run "${LIMIT_PROBE:-150}" probe python3 scripts/gpu_probe.py smollm2-135m llama-3.1-8b ;;
    probe-small) PROBE_MODES=${PROBE_MODES_SMALL:-${PROBE_MODES:-}} run "${LIMIT_PROBE:-150}" probe-small \
                   python3 scripts/gpu_probe.py smollm2-135m ;;
    probe-8b) PROBE_MODES=${PROBE_MODES_8B:-${PROBE_MODES:-}} run "${LIMIT_PROBE:-150}" probe-8b \
                python3 scripts/gpu_probe.py llama-3.1-8b ;;
    bench-small) run "${LIMIT_SMALL:-150}" bench-small python3 -m hvd_agents.cli -v bench-gpu --model random:smollm2-135m \
                   --max-new-tokens 64 --max-prompts "${SMALL_PROMPTS:-6}" "${prompt_args[@]}" --json "$LOGS/bench-small.json" ;;
    bench-8b) run "${LIMIT_8B:-240}" bench-8b python3 -m hvd_agents.cli -v bench-gpu --model random:llama-3.1-8b \
                --max-new-tokens 64 --max-prompts "${LARGE_PROMPTS:-6}" "${prompt_args[@]}" --json "$LOGS/bench-8b.json" ;;
    *) echo "unknown stage $stage" ;;
  esac
done
