#!/usr/bin/env bash
# The checks that need a CUDA host, in one run (docs/benchmarks.md, "On a GPU"):
#   1. the quickstart trained end to end: learner on CUDA, two actors with vLLM on the GPU, or
#      the hf engine on CUDA where the vllm package is missing (ENGINE=hf|vllm to choose);
#   2. bench/real_scale.py: learner steps and weight sync at real shapes, both on CUDA;
#   3. bench/layers_bench.py on this host's cores (CPU only; a second machine's figure);
#   4. the engine test that checks actor.device = "auto" finds the GPU.
#
#   bash bench/gpu_check.sh                          # results in /tmp/gpu_check
#   OUT=dir SHAPES=qwen2.5-0.5b E2E_STEPS=40 bash bench/gpu_check.sh
#
# Each part has its own time limit and a failing part does not stop the next; what each part
# printed is in OUT/PART.log, its figures in OUT/*.json.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
PY=${PY:-python3}
SHAPES=${SHAPES:-qwen2.5-0.5b,qwen2.5-1.5b}
E2E_STEPS=${E2E_STEPS:-40}
E2E_DEVICE=${E2E_DEVICE:-cuda}
ENGINE=${ENGINE:-$($PY -c "import vllm" >/dev/null 2>&1 && echo vllm || echo hf)}
WORK=${WORK:-/tmp/gpu_check_work}
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1

part() {  # part NAME SECONDS CMD...: run CMD under a limit, its output in OUT/NAME.log
    local name=$1 limit=$2
    shift 2
    echo "=== $name (limit ${limit}s): $*"
    local t0=$SECONDS
    timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "=== $name: exit $rc after $((SECONDS - t0)) s"
    tail -n 25 "$OUT/$name.log"
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
  nproc; echo "engine: $ENGINE"; } >"$OUT/host.txt" 2>&1
cat "$OUT/host.txt"

part e2e 240 $PY -m agentgym.cli train --config configs/quickstart.toml --run-dir "$WORK/e2e" \
    --max-steps "$E2E_STEPS" -o "learner.device=\"$E2E_DEVICE\"" -o "actor.engine=\"$ENGINE\"" \
    -o "actor.device=\"$E2E_DEVICE\"" -o 'actor.gpu_memory_utilization=0.3' -o 'eval.every=20' -o 'eval.tasks=8' -o 'model.path="'"$WORK"'/tiny"'
cp "$WORK/e2e/summary.json" "$OUT/e2e_summary.json" 2>/dev/null
$PY - "$WORK/e2e/metrics.jsonl" >"$OUT/e2e_steps.txt" 2>&1 <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
keys = ("step", "train_time_s", "learner_utilisation", "learner_export_s", "cuda_max_allocated_mib", "peak_rss_mib")
for r in rows:
    if "train_time_s" in r:
        print({k: r[k] for k in keys if k in r})
EOF
tail -n 3 "$OUT/e2e_steps.txt"

part real_scale 420 $PY bench/real_scale.py --shapes "$SHAPES" --engine "$ENGINE" --train-steps 3 \
    --groups 8 --group-size 8 --tokens 1024 --checkpointing --models "$WORK/models" --out "$OUT"

part layers 120 $PY bench/layers_bench.py

part tests 120 $PY -m pytest -q -p no:cacheprovider tests/test_engines.py -k config_chooses
