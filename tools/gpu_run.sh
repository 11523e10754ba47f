#!/usr/bin/env bash
# One stage of the GPU work of issue 12, run ON the device machine (docs/gpu.md), e.g. as the
# device tool's command:  bash tools/gpu_run.sh suite      (carry: .whl .gpu-data)
# Stages (each well under the 10 minutes a command may run; results under $OUT):
#   suite                the whole test suite on CUDA (Triton kernels compiled, not interpreted)
#   tune [KERNEL ...]    time the Triton tile candidates at N = D = 512, C = 1M, bf16
#   race                 the fused loss against the 4-GEMM floor and its peers, C = 100k and 1M
#   train10m             3 optimizer steps of the fused head at C = 10M (bf16): memory
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/gpu-out}"
mkdir -p "$OUT"
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH="$PWD/src:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 KERAS_BACKEND=torch
if [ -d .gpu-data ] && [ ! -e ../shared/data ]; then
    mkdir -p ../shared && ln -s "$PWD/.gpu-data" ../shared/data
fi
stage="${1:-suite}"
shift || true
{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} > "$OUT/env-$stage.txt" 2>&1
cat "$OUT/env-$stage.txt"
case "$stage" in
    suite)
        timeout 540 python3 -m pytest -n 8 -q -p no:cacheprovider -rfEs \
            --junitxml="$OUT/suite.xml" 2>&1 | tee "$OUT/suite.log" | tail -60
        ;;
    tune)
        timeout 560 python3 benchmarks/tune_triton.py --classes 1000000 --dtype bfloat16 \
            ${1:+--kernels "$@"} --json "$OUT/tune.json" 2>&1 | tee "$OUT/tune.log" | tail -40
        ;;
    race)
        timeout 560 python3 benchmarks/bench_gpu.py --classes 100000 1000000 --dtype bfloat16 \
            --json "$OUT/race.json" 2>&1 | tee "$OUT/race.log" | tail -40
        ;;
    train10m)
        timeout 560 python3 benchmarks/bench_gpu.py --classes 10000000 --dtype bfloat16 \
            --train-steps 3 --json "$OUT/train10m.json" 2>&1 | tee "$OUT/train10m.log" | tail -20
        ;;
    *)
        echo "unknown stage $stage (suite, tune, race, train10m)" >&2
        exit 2
        ;;
esac
