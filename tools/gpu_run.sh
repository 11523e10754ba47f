#!/usr/bin/env bash
# One stage of the GPU work of issue 12, run ON the device machine (docs/gpu.md), e.g. as the
# device tool's command:  bash tools/gpu_run.sh suite      (carry: .whl .gpu-data)
# Stages (each well under the 10 minutes a command may run; results under $OUT):
#   suite                the whole test suite on CUDA (Triton kernels compiled, not interpreted)
#   tune [KERNEL ...]    time the Triton tile candidates at N = D = 512, C = 1M, bf16
#   race                 the fused loss against the 4-GEMM floor and its peers, C = 100k and 1M
#   train10m             3 optimizer steps of the fused head at C = 10M (bf16): memory
#   lfw1, lfw2           LFW's archive in two halves (carry .gpu-lfw1, then .gpu-lfw2, on a
#                        warm machine): joined into /tmp/lfw-data/lfw and checked
#   face FOLD [LOSS ...] iresnet18, 112×112 RGB, on LFW test fold FOLD (default losses arcface
#                        curricularface), the recipe of examples/lfw_iresnet.toml
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
    lfw1)
        mkdir -p /tmp/lfw-parts && cp .gpu-lfw1/part /tmp/lfw-parts/1 && ls -l /tmp/lfw-parts
        ;;
    lfw2)
        mkdir -p /tmp/lfw-parts /tmp/lfw-data/lfw && cp .gpu-lfw2/part /tmp/lfw-parts/2 || exit 1
        cat /tmp/lfw-parts/1 /tmp/lfw-parts/2 > /tmp/lfw-data/lfw/lfw-deepfunneled.tar.gz || exit 1
        cp .gpu-lfw2/pairs.txt /tmp/lfw-data/lfw/
        echo "$(cat .gpu-lfw2/sha256)  /tmp/lfw-data/lfw/lfw-deepfunneled.tar.gz" | sha256sum -c
        ;;
    face)
        fold="${1:?face needs a test fold, 0-9}"
        shift
        losses=("${@:-arcface curricularface}")
        # shellcheck disable=SC2068 (the losses split into words on purpose)
        timeout 570 python3 benchmarks/bench_verification.py --dataset lfw --folds "$fold" \
            --losses ${losses[@]} --model iresnet18 --rgb --image-size 112 \
            --min-images-per-identity 2 --epochs 20 --batch-size 128 --optimizer sgd --lr 0.1 \
            --weight-decay 5e-4 --schedule cosine --warmup-epochs 1 --scale 64 --flip \
            --augment hflip=0.5 --device cuda --amp bf16 --data-dir /tmp/lfw-data \
            --out "$OUT" --tag "iresnet18_112px_fold$fold" 2>&1 | tee "$OUT/face-$fold.log" | tail -20
        ;;
    *)
        echo "unknown stage $stage (suite, tune, race, train10m, lfw1, lfw2, face)" >&2
        exit 2
        ;;
esac
