#!/usr/bin/env bash
# The GPU work, run ON the device machine (docs/gpu.md). A lent session runs ONE command:
#   bash tools/gpu_run.sh all          (device tool: carry [".whl"], timeout_s 540)
# `all` fits in GPU_BUDGET seconds (default 480) and writes each result under $OUT the moment
# it has it, in order of value: correctness on CUDA, the backward probe at C = 1M (both Triton
# backwards, gradient-tile and statistics tiles checked against the fused kernels, the fastest
# written to tuned.json), the race at C = 1M with those tiles, three steps at
# C = 10M, then a tile sweep and the pretrained models' networks (dlib's ResNet, facenet's
# InceptionResnetV1, MTCNN) if time is left. Without CUDA (make test's dry run,
# tests/test_gpu_kit.py) the same script runs, each CUDA part replaced by one line and a smoke run
# of its logic.
# The single stages below are for a later session with more device time:
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
stage="${1:-all}"
shift || true
{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv \
        2>/dev/null || echo "no nvidia-smi: no GPU here"
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
} > "$OUT/env-$stage.txt" 2>&1
cat "$OUT/env-$stage.txt"
case "$stage" in
    all)
        budget="${GPU_BUDGET:-480}"
        began=$(date +%s)
        left() { echo $((budget - ($(date +%s) - began))); }
        cap() {  # cap WANT: WANT seconds, or what is left of the budget if less (>= 1)
            local want=$1 rest
            rest=$(left)
            ((rest < want)) && want=$rest
            ((want < 1)) && want=1
            echo "$want"
        }
        cuda=$(python3 -c "import torch; print(int(torch.cuda.is_available()))")
        # 1. correctness on CUDA: the Triton kernels, chunked == dense for every loss in
        #    bf16/fp32 (the precision matrix), torch.compile of the fused path; 8 workers (the
        #    second session's 734 tests did not finish in 170 s on 4)
        checks=(tests/executors/test_triton.py tests/executors/test_triton_host_reads.py
            tests/executors/test_triton_rules.py
            tests/executors/test_triton_row_statistics.py tests/executors/test_binary_triton.py
            tests/executors/test_precision_matrix.py tests/executors/test_compile.py
            tests/executors/test_triton_gradient_tiles.py)
        if [ "$cuda" = 1 ]; then
            timeout "$(cap 170)" python3 -m pytest -q -p no:cacheprovider -n 8 -rfE \
                --junitxml="$OUT/correctness.xml" "${checks[@]}" 2>&1 \
                | tee "$OUT/correctness.log" | tail -25
        else
            echo "correctness: skipped, no CUDA; collecting the same tests instead"
            python3 -m pytest -q -p no:cacheprovider --collect-only "${checks[@]}" 2>&1 \
                | tail -1 | tee "$OUT/correctness-collected.txt"
        fi
        smoke=()
        methods=()
        if [ "$cuda" != 1 ]; then
            smoke=(--smoke)
            methods=(--methods gemm4 dense fused fused_torch plain pml liger cce)
        fi
        # 2. the backward probe, bf16, C = 1M: both Triton backwards, gradient-tile and
        #    statistics tiles (each checked against the first variant, the fused kernels), a
        #    larger class tile, the step without value checks (no host sync), a profile of the
        #    tiled step with and without them; the fastest tiles -> tuned.json
        echo '{}' > "$OUT/tuned.json"
        timeout "$(cap 110)" python3 benchmarks/probe_gpu_chunks.py --classes 1000000 \
            --kernels triton --chunks 0 --backwards fused tiles \
            --tile-blocks 128x128x32x8x3 128x128x64x8x3 64x128x64x4x3 128x64x64x4x3 \
            64x256x32x8x3 --statistics-blocks 128x256x32x8x3 128x128x64x8x3 \
            --tile-bytes 268435456 --unchecked --check --profile triton:tiles triton:unchecked \
            --repeats 7 "${smoke[@]}" \
            --best "$OUT/tuned.json" --json "$OUT/probe.json" 2>&1 | tee "$OUT/probe.log" \
            | tail -30
        # 3. the race, bf16, N = D = 512, C = 1M, with the probe's tiles
        timeout "$(cap 130)" python3 benchmarks/bench_gpu.py --classes 1000000 \
            --dtype bfloat16 --repeats 10 --warmup 2 "${smoke[@]}" \
            "${methods[@]}" --tuned "$OUT/tuned.json" --json "$OUT/race.json" 2>&1 \
            | tee "$OUT/race.log" | tail -25
        # 4. three SGD steps at C = 10M, bf16: time and workspace
        timeout "$(cap 60)" python3 benchmarks/bench_gpu.py --classes 10000000 \
            --dtype bfloat16 --train-steps 3 "${smoke[@]}" --tuned "$OUT/tuned.json" \
            --json "$OUT/train10m.json" 2>&1 | tee "$OUT/train10m.log" | tail -5
        # 5. with what is left: a tile sweep of the statistics kernel
        if [ "$cuda" != 1 ]; then
            echo "tune: skipped, no CUDA"
        elif (($(left) < 60)); then
            echo "tune: skipped, $(left) s left"
        else
            timeout "$(cap 600)" python3 benchmarks/tune_triton.py --classes 1000000 \
                --dtype bfloat16 --kernels statistics --json "$OUT/tune.json" 2>&1 \
                | tee "$OUT/tune.log" | tail -15
        fi
        # 6. optional, with what is left: the pretrained models' networks on the device
        #    (dlib's ResNet and InceptionResnetV1 throughput, MTCNN per photo)
        if [ "$cuda" != 1 ]; then
            timeout 240 python3 benchmarks/bench_pretrained_gpu.py --device cpu --smoke \
                --json "$OUT/pretrained.json" 2>&1 | tail -4
        elif (($(left) < 40)); then
            echo "pretrained: skipped, $(left) s left"
        else
            timeout "$(cap 120)" python3 benchmarks/bench_pretrained_gpu.py --device cuda \
                --json "$OUT/pretrained.json" 2>&1 | tee "$OUT/pretrained.log" | tail -6
        fi
        echo "all: done in $(($(date +%s) - began)) s of $budget"
        ;;
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
        echo "unknown stage $stage (all, suite, tune, race, train10m, lfw1, lfw2, face)" >&2
        exit 2
        ;;
esac
