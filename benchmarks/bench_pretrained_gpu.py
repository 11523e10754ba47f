"""The pretrained models' networks on a device: embedding throughput of dlib's ResNet v1
(150 px) and facenet-pytorch's InceptionResnetV1 (160 px), and MTCNN's detection time per
photo, on ``--device`` (CUDA on the GPU kit's last stage, tools/gpu_run.sh).

The weights are random (the networks' speed does not depend on them, and the pretrained files
do not travel to the device machine); MTCNN uses facenet-pytorch's weights when they are
installed and is skipped otherwise. ``--smoke`` runs every part on tiny inputs (the kit's dry
run on a machine without CUDA).

Usage::

    PYTHONPATH=src python benchmarks/bench_pretrained_gpu.py --device cuda --json out.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def throughput(
    model: torch.nn.Module, side: int, batch: int, repeats: int, device: torch.device
) -> dict[str, float]:
    """Median seconds per forward of ``batch`` images, and images per second."""
    x = torch.randn(batch, 3, side, side, device=device)
    model = model.to(device).eval()
    times = []
    with torch.no_grad():
        model(x)  # warm-up (cuDNN's choice of kernels)
        for _ in range(repeats):
            _sync(device)
            start = time.perf_counter()
            model(x)
            _sync(device)
            times.append(time.perf_counter() - start)
    median = float(np.median(times))
    return {"batch": batch, "median_s": median, "images_per_s": batch / median}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--smoke", action="store_true", help="tiny inputs (a dry run)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    from marginface.models.dlib_resnet import DlibResNet
    from marginface.models.inception_resnet_v1 import InceptionResnetV1

    batches = (2,) if args.smoke else (64, 256)
    repeats = 1 if args.smoke else args.repeats
    rows = []
    for name, make, side in (
        ("dlib-resnet-v1", DlibResNet, 150),
        ("inception-resnet-v1", InceptionResnetV1, 160),
    ):
        torch.manual_seed(0)
        model = make()
        for batch in batches:
            row = {
                "model": name,
                "device": str(device),
                **throughput(model, side, batch, repeats, device),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    try:
        from marginface.detect import MTCNN

        detector = MTCNN(device=device)
    except Exception as error:  # weights not installed on the device machine
        print(f"mtcnn: skipped ({str(error).splitlines()[0][:120]})")
    else:
        photos = [
            np.random.default_rng(k).integers(0, 256, (250, 250, 3), dtype=np.uint8)
            for k in range(2 if args.smoke else 32)
        ]
        detector.detect(photos[:2])  # warm-up
        _sync(device)
        start = time.perf_counter()
        detector.detect(photos)
        _sync(device)
        row = {
            "model": "mtcnn",
            "device": str(device),
            "photos": len(photos),
            "ms_per_photo": 1000 * (time.perf_counter() - start) / len(photos),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
