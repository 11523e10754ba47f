"""Fine-tuning a pretrained model with margin losses on a CPU (issue 46): before and after.

Protocol: the identities of ORL or Extended Yale B (cropped) are split in two halves (the
loaders' ``split="open"``, ``test_fraction=0.5``, seed 0); ``dlib-resnet-v1`` is fine-tuned
with the finetune recipe (``train --init-from dlib-resnet-v1``) on one half and tested on the
other, BEFORE (the pretrained weights) and AFTER, once per margin (ArcFace, CosFace), same split
and seeds. Metrics on the test half, from L2-normalised embeddings (cosine scores):

* verification over every pair of test images: TAR at the smallest FAR of 1e-k that the
  number P of impostor pairs supports (FAR >= 10 / P, i.e. at least 10 impostors above the
  threshold), and the equal error rate;
* identification rank-1: a gallery of one image per test identity (drawn with seeds 0..4;
  the mean and range over the five draws), the other images probes.

Faces: the datasets' own crops (ORL 112x92, Yale B 192x168, grey), centre-cropped to a square
and resized to 150x150 by the loaders, the grey channel repeated to RGB. **Not dlib's face
chip** (aligned on landmarks, padding 0.25): the pretrained model sees tighter crops than it was
trained on, and fine-tuning also adapts it to that crop.

``--dataset auto`` measures BEFORE on both and fine-tunes on the one with the lower rank-1.
The training epochs evaluate on a 2-image-per-identity slice of the training half (the
figures here are computed by this script on the test half, not by the trainer).

Run (2 cores shared, nice'd):
    PYTHONPATH=src nice -n 10 python benchmarks/bench_finetune.py --data-dir ../shared/data
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from marginface.data.base import DatasetBundle, ImageSet
from marginface.models.catalogue import open_pretrained
from marginface.train import Trainer
from marginface.train.build import load_bundle
from marginface.train.config import TrainConfig, describe_recipe
from marginface.train.embeddings import extract_embeddings


def base_config(dataset: str, data_dir: str, threads: int, **values: Any) -> TrainConfig:
    return TrainConfig(
        dataset=dataset,
        data_dir=data_dir,
        init_from="dlib-resnet-v1",
        dataset_options={"split": "open", "test_fraction": 0.5},
        device="cpu",
        threads=threads,
        eval_batch_size=64,
        seed=0,
        **values,
    )


def embed(model: torch.nn.Module, images: np.ndarray) -> torch.Tensor:
    return F.normalize(extract_embeddings(model, images, batch_size=64), dim=1)


def verification(scores: torch.Tensor, same: torch.Tensor) -> dict[str, float]:
    """TAR at the smallest 1e-k FAR with >= 10 impostors above the threshold, and the EER."""
    upper = torch.triu(torch.ones_like(same, dtype=torch.bool), diagonal=1)
    genuine = scores[upper & same]
    impostor = scores[upper & ~same]
    pairs = impostor.numel()
    far = 10 ** np.ceil(np.log10(10 / pairs))
    ranked = impostor.sort(descending=True).values
    threshold = ranked[int(far * pairs) - 1]  # far * P impostors at or above it
    tar = float((genuine > threshold).float().mean())
    # EER at the exact crossing: every score a candidate threshold
    thresholds = torch.cat([genuine, impostor]).sort().values
    frr = torch.searchsorted(genuine.sort().values, thresholds).float() / genuine.numel()
    accepted = torch.searchsorted(impostor.sort().values, thresholds)
    fars = 1 - accepted.float() / impostor.numel()
    k = int((frr - fars).abs().argmin())
    return {
        "far": float(far),
        "tar": tar,
        "eer": float((frr[k] + fars[k]) / 2),
        "genuine_pairs": int(genuine.numel()),
        "impostor_pairs": pairs,
    }


def rank1(embeddings: torch.Tensor, labels: np.ndarray, draws: int = 5) -> list[float]:
    """Rank-1 identification over ``draws`` seeded galleries of one image per identity."""
    results = []
    for seed in range(draws):
        rng = np.random.default_rng(seed)
        gallery = np.array([rng.choice(np.flatnonzero(labels == k)) for k in np.unique(labels)])
        probes = np.setdiff1d(np.arange(len(labels)), gallery)
        scores = embeddings[probes] @ embeddings[gallery].T
        found = labels[gallery][scores.argmax(1).numpy()]
        results.append(float((found == labels[probes]).mean()))
    return results


def measure(model: torch.nn.Module, test: ImageSet) -> dict[str, Any]:
    began = time.perf_counter()
    e = embed(model, test.images)
    labels = np.asarray(test.labels)
    same = torch.as_tensor(labels[:, None] == labels[None, :])
    result = verification(e @ e.T, same)
    ranks = rank1(e, labels)
    result.update(
        rank1_mean=float(np.mean(ranks)),
        rank1_min=min(ranks),
        rank1_max=max(ranks),
        images=len(labels),
        identities=len(np.unique(labels)),
        embed_seconds=time.perf_counter() - began,
    )
    return result


def write_yaleb_chips(data_dir: Path, out: Path, pad: int = 72) -> None:
    """Yale B's illumination images (those of marginface.data.yaleb) as dlib chips,
    ``out/<subject>/<image>.png``: each 192x168 crop framed by ``pad`` black pixels (MTCNN
    misses faces that touch the frame), its face found by MTCNN on a histogram-equalised copy
    (the darkest lightings hide it otherwise), the subject face chosen, and the chip cut from
    the framed original (``cut_face(..., crop="dlib-chip")``). Images without a face are
    counted and left out."""
    import io
    import tarfile

    import cv2
    from PIL import Image

    from marginface.data.face_crops import cut_face
    from marginface.data.face_photos import select_faces
    from marginface.data.yaleb import _YALEB_MEMBER
    from marginface.detect import MTCNN

    detector = MTCNN()
    written = missed = 0
    with tarfile.open(data_dir / "yaleb" / "CroppedYale.tar.gz") as archive:
        for member in archive:
            found = _YALEB_MEMBER.search(member.name)
            if found is None or not member.isfile():
                continue
            with Image.open(io.BytesIO(archive.extractfile(member).read())) as image:
                grey = np.asarray(image.convert("L"))
            framed = np.pad(grey, pad)
            faces = detector.detect(np.repeat(cv2.equalizeHist(framed)[:, :, None], 3, axis=2))[0]
            chosen = select_faces(faces, framed.shape, "subject")
            if not chosen:
                missed += 1
                continue
            k = chosen[0]
            rgb = np.repeat(framed[:, :, None], 3, axis=2)
            chip = cut_face(rgb, faces.landmarks[k], faces.boxes[k], crop="dlib-chip", size=150)
            target = out / found.group(1) / (Path(member.name).stem + ".png")
            target.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(chip).save(target)
            written += 1
    print(f"{written} chips written under {out}; {missed} images without a face left out")


def small_eval_slice(train: ImageSet) -> ImageSet:
    keep = np.concatenate([np.flatnonzero(train.labels == k)[:2] for k in np.unique(train.labels)])
    return ImageSet(train.images[keep], train.labels[keep], train.class_names)


def show(name: str, r: dict[str, Any]) -> None:
    print(
        f"{name:<22} TAR@FAR={r['far']:.0e} {100 * r['tar']:6.2f}%  EER {100 * r['eer']:5.2f}%  "
        f"rank-1 {100 * r['rank1_mean']:6.2f}% ({100 * r['rank1_min']:.2f}-"
        f"{100 * r['rank1_max']:.2f})",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default="../shared/data")
    parser.add_argument(
        "--dataset",
        choices=("auto", "orl", "yaleb", "folder"),
        default="auto",
        help="folder: --data-dir is FOLDER/<identity>/<image> (e.g. Yale B's dlib chips)",
    )
    parser.add_argument(
        "--write-yaleb-chips",
        type=Path,
        default=None,
        metavar="DIR",
        help="only write Yale B's illumination images as dlib chips, DIR/<subject>/<image>.png "
        "(then --dataset folder --data-dir DIR)",
    )
    parser.add_argument("--losses", default="arcface,cosface")
    parser.add_argument("--epochs", type=int, default=None, help="default: the recipe's")
    parser.add_argument("--lr", type=float, default=None, help="default: the recipe's")
    parser.add_argument("--limit", type=int, default=None, help="cap on training images")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench_finetune"))
    args = parser.parse_args()
    if args.write_yaleb_chips is not None:
        write_yaleb_chips(Path(args.data_dir), args.write_yaleb_chips)
        return
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    pretrained, _, _ = open_pretrained("dlib-resnet-v1")
    report: dict[str, Any] = {"before": {}, "after": {}}
    bundles: dict[str, DatasetBundle] = {}
    for name in ("orl", "yaleb") if args.dataset == "auto" else (args.dataset,):
        bundles[name] = load_bundle(base_config(name, args.data_dir, args.threads))
        if name == "folder":
            found = bundles[name]
            print(f"folder {args.data_dir}: {len(found.train)} + {len(found.test)} images")
        report["before"][name] = measure(pretrained, bundles[name].test)
        show(f"{name} before", report["before"][name])
    chosen = min(report["before"], key=lambda n: report["before"][n]["rank1_mean"])
    bundle = bundles[chosen]
    train = bundle.train
    if args.limit is not None and args.limit < len(train):
        keep = np.sort(np.random.default_rng(0).permutation(len(train))[: args.limit])
        train = ImageSet(train.images[keep], train.labels[keep], train.class_names)
    print(
        f"fine-tuning on {chosen}: {len(train)} training images of {train.num_classes} "
        f"identities; test: {len(bundle.test)} images of {bundle.test.num_classes}",
        flush=True,
    )
    runs = DatasetBundle(chosen, train, small_eval_slice(train))
    for loss in args.losses.split(","):
        extra = {"epochs": args.epochs} if args.epochs else {}
        extra.update({"lr": args.lr} if args.lr else {})
        config = base_config(chosen, args.data_dir, args.threads, loss=loss, **extra)
        print(describe_recipe(config), flush=True)
        began = time.perf_counter()
        trainer = Trainer(config, args.out / f"{chosen}-{loss}", bundle=runs)
        trainer.fit(overwrite=True)
        seconds = time.perf_counter() - began
        result = measure(trainer.model, bundle.test)
        result.update(train_seconds=seconds, epochs=config.epochs, losses=[
            round(row["loss"], 4) for row in trainer.history
        ])  # fmt: skip
        report["after"][loss] = result
        show(f"{chosen} after {loss}", result)
        print(f"  training {seconds:.0f} s, loss by epoch {result['losses']}", flush=True)
    report["dataset"] = chosen
    report["wall_seconds"] = time.perf_counter() - started
    report["torch"] = torch.__version__
    print(f"wall time {report['wall_seconds']:.0f} s")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
