#!/usr/bin/env bash
# Prepare, on the development machine, what a GPU session carries to the device machine
# (docs/gpu.md), in folders ignored by git:
#
#   bash tools/gpu_prepare.sh                 # .whl/: the race's peers and MTCNN's weights
#                                             # (3 MB): for `all`
#   bash tools/gpu_prepare.sh --stages [DATA] # also the single stages' extras (suite, face):
#                                             # more wheels, .gpu-data/, LFW in two halves
set -euo pipefail
cd "$(dirname "$0")/.."
stages=0
if [ "${1:-}" = "--stages" ]; then
    stages=1
    shift
fi
data="${1:-../shared/data}"

# The device image (docs/gpu.md) has torch, triton, numpy, scipy, scikit-learn, matplotlib,
# pillow, tqdm, pytest(-xdist), hypothesis, onnx(runtime/script). The race's margin-free peers
# are not there; their wheels are pure Python (their dependencies are in the image).
# facenet-pytorch's wheel carries MTCNN's weights (the kit's last stage finds them installed).
peers=(pytorch-metric-learning==2.9.0 liger-kernel==0.8.5 cut-cross-entropy==25.1.1
    facenet-pytorch==2.6.0)
extras=()
if [ "$stages" = 1 ]; then  # what the whole suite also imports (plotly < 7: pyproject's bound)
    extras=(plotly==6.9.0 keras==3.15.1 namex==0.1.0 optree==0.20.0)
fi
rm -rf .whl && mkdir -p .whl
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "${peers[@]}" "${extras[@]}"
if [ "$stages" = 0 ]; then
    du -sh .whl
    exit 0
fi

# Small datasets the tests read from ../shared/data (LFW, 104 MB, and Extended Yale B, 55 MB, do
# not fit in a call's 64 MiB: their tests skip there).
rm -rf .gpu-data && mkdir -p .gpu-data
for name in mnist fashion-mnist omniglot orl README.md; do
    if [ -e "$data/$name" ]; then cp -r "$data/$name" .gpu-data/; fi
done
if [ -e "$data/lfw/pairs.txt" ]; then mkdir -p .gpu-data/lfw && cp "$data/lfw/pairs.txt" .gpu-data/lfw/; fi

# LFW's images (104 MB) travel in two calls of their own (tools/gpu_run.sh lfw1, lfw2): halves
# of the archive in .gpu-lfw1/ and .gpu-lfw2/, joined and checked (sha256) on the device.
rm -rf .gpu-lfw1 .gpu-lfw2
archive="$data/lfw/lfw-deepfunneled.tar.gz"
if [ -e "$archive" ]; then
    mkdir -p .gpu-lfw1 .gpu-lfw2
    half=$(( ($(stat -c %s "$archive") + 1) / 2 ))
    head -c "$half" "$archive" > .gpu-lfw1/part
    tail -c +"$((half + 1))" "$archive" > .gpu-lfw2/part
    sha256sum "$archive" | cut -d' ' -f1 > .gpu-lfw2/sha256
    cp "$data/lfw/pairs.txt" .gpu-lfw2/
fi
du -sh .whl .gpu-data .gpu-lfw1 .gpu-lfw2 2>/dev/null
