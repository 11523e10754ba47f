"""LFW identities searched with a pretrained model, the way a new user goes: raw photos →
gallery → search, through the command line, at a threshold calibrated on other people.

People with >= 2 photos in LFW deep-funneled are shuffled (``--seed``) and split:

* **calibration** people (``--calibration-people``, up to 4 photos each): every pair of their
  photos, genuine and impostor, scored with ``FaceModel(MODEL, detector="mtcnn")``; the
  threshold is the lowest whose false accept rate on those impostor pairs is <= ``--far``
  (:func:`marginface.inference.calibration.calibrate_threshold`), reported with the number of
  impostor pairs, the smallest FAR they support (10 / impostors) and the measured FAR's exact
  95 % interval;
* **enrolled** people (``--people``, >= 3 photos): their first photo forms the gallery, up to 4
  of the others are mated probes;
* **strangers** (``--strangers``, other people): up to 2 photos each, non-mated probes.

Both paths of the command line run on the same photos and threshold, each command timed:

1. two commands per side: ``align --detector mtcnn --for-model MODEL`` (gallery photos and
   probes), then ``gallery build`` and ``search`` on the crops;
2. one command per side: ``gallery build ... --detector mtcnn`` and
   ``search ... --detector mtcnn`` on the raw photos.

Reported per path: rank-1 of the mated probes (best match right, whatever the threshold),
FNIR (mated probes not accepted as their own identity), FPIR (strangers accepted), mated probes
accepted as someone else, and the commands' wall seconds.

Usage (docs/benchmarks.md)::

    python benchmarks/bench_pretrained_search.py --data-dir ../shared/data --work /tmp/search
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tarfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

ARCHIVE = "lfw/lfw-deepfunneled.tar.gz"


def lfw_people(data_dir: Path) -> dict[str, list[str]]:
    """``{person: [photo names in order]}`` of the archive (names ``Person/Person_0001.jpg``)."""
    people: dict[str, list[str]] = defaultdict(list)
    with tarfile.open(data_dir / ARCHIVE) as archive:
        for member in archive:
            parts = member.name.split("/")
            if member.isfile() and len(parts) == 3 and parts[2].endswith(".jpg"):
                people[parts[1]].append(f"{parts[1]}/{parts[2]}")
    return {person: sorted(names) for person, names in people.items()}


def extract(data_dir: Path, wanted: dict[str, Path]) -> None:
    """Write each archive photo ``name`` of ``wanted`` to its target path."""
    with tarfile.open(data_dir / ARCHIVE) as archive:
        for member in archive:
            name = member.name.split("/", 1)[-1]
            if name in wanted and member.isfile():
                wanted[name].parent.mkdir(parents=True, exist_ok=True)
                wanted[name].write_bytes(archive.extractfile(member).read())


def run(command: list[str]) -> float:
    """Run ``marginface COMMAND`` (this interpreter), return its wall seconds; raise on failure."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "marginface", "--quiet", *command],
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"marginface {' '.join(command)} failed:\n{done.stderr}")
    return seconds


def calibrate(model_name: str, photos: list[Path], far: float) -> dict[str, float]:
    """The threshold at ``far`` on every pair of ``photos`` (identity = folder name)."""
    from marginface.inference import FaceModel
    from marginface.inference.calibration import calibrate_threshold

    model = FaceModel(model_name, detector="mtcnn", faces="central")
    kept, rows = [], []
    for start in range(0, len(photos), 32):
        chunk = photos[start : start + 32]
        try:
            rows.extend(model.embed([str(p) for p in chunk]))
            kept.extend(p.parent.name for p in chunk)
        except ValueError:  # a photo without a face: the chunk one by one, that one left out
            for path in chunk:
                try:
                    rows.append(model.embed(str(path))[0])
                    kept.append(path.parent.name)
                except ValueError:
                    continue
    embeddings = np.stack(rows)
    first, second = np.triu_indices(len(kept), k=1)
    scores = np.sum(embeddings[first] * embeddings[second], axis=1)
    labels = np.array(kept)
    same = labels[first] == labels[second]
    found = calibrate_threshold(scores, same, far, pairs="every pair of the calibration photos")
    return {
        "threshold": found.threshold,
        "far_target": far,
        "far_measured": found.false_accepts / found.impostors,
        "far_interval_95": list(found.far_interval),
        "tar": found.true_accepts / found.genuine,
        "impostor_pairs": found.impostors,
        "genuine_pairs": found.genuine,
        "smallest_far_supported": found.min_errors / found.impostors,
        "summary": found.summary(),
        "photos": len(kept),
        "photos_without_face": len(photos) - len(kept),
    }


def score(results: list[dict], enrolled: set[str]) -> dict[str, float]:
    """Rank-1, FNIR, FPIR and wrong accepts of ``search --out x.json``'s rows."""
    mated = [r for r in results if r["probe"].split("/")[0] in enrolled]
    strangers = [r for r in results if r["probe"].split("/")[0] not in enrolled]

    def truth(row: dict) -> str:
        return row["probe"].split("/")[0]

    rank1 = np.mean([r["matches"][0]["identity"] == truth(r) for r in mated])
    right = np.mean([r["identity"] == truth(r) for r in mated])
    wrong = sum(r["identity"] not in (None, truth(r)) for r in mated)
    return {
        "mated_probes": len(mated),
        "non_mated_probes": len(strangers),
        "rank1": float(rank1),
        "fnir": float(1 - right),
        "fpir": float(np.mean([r["identity"] is not None for r in strangers])),
        "mated_accepted_as_someone_else": int(wrong),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--work", type=Path, default=Path("/tmp/pretrained-search"))
    parser.add_argument("--model", default="dlib-resnet-v1")
    parser.add_argument("--people", type=int, default=60)
    parser.add_argument("--strangers", type=int, default=30)
    parser.add_argument("--calibration-people", type=int, default=200)
    parser.add_argument("--far", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    people = lfw_people(args.data_dir)
    order = sorted(p for p, names in people.items() if len(names) >= 2)
    random.Random(args.seed).shuffle(order)
    calibration = order[: args.calibration_people]
    rest = order[args.calibration_people :]
    enrolled = [p for p in rest if len(people[p]) >= 3][: args.people]
    strangers = [p for p in rest if p not in enrolled][: args.strangers]
    photos = args.work / "photos"
    wanted: dict[str, Path] = {}
    for person in calibration:
        for name in people[person][:4]:
            wanted[name] = photos / "calibration" / name
    for person in enrolled:
        wanted[people[person][0]] = photos / "gallery" / people[person][0]
        for name in people[person][1:5]:
            wanted[name] = photos / "probes" / name
    for person in strangers:
        for name in people[person][:2]:
            wanted[name] = photos / "probes" / name
    if not all(path.is_file() for path in wanted.values()):
        extract(args.data_dir, wanted)

    result: dict[str, object] = {"model": args.model, "seed": args.seed}
    start = time.perf_counter()
    calibration_photos = sorted((photos / "calibration").rglob("*.jpg"))
    result["calibration"] = calibrate(args.model, calibration_photos, args.far)
    result["calibration"]["seconds"] = time.perf_counter() - start  # type: ignore[index]
    threshold = f"{result['calibration']['threshold']:.6f}"  # type: ignore[index]
    print(json.dumps(result["calibration"]), flush=True)

    work = args.work
    times: dict[str, dict[str, float]] = {"two_commands": {}, "one_command": {}}
    two = times["two_commands"]
    for side in ("gallery", "probes"):
        two[f"align {side}"] = run(
            ["align", str(photos / side), "--out", str(work / "chips" / side), "--detector",
             "mtcnn", "--for-model", args.model, "--faces", "central"]
        )  # fmt: skip
    two["gallery build"] = run(
        ["gallery", "build", args.model, str(work / "chips" / "gallery"), "--out",
         str(work / "gallery-crops"), "--overwrite"]
    )  # fmt: skip
    two["search"] = run(
        ["search", str(work / "gallery-crops"), str(work / "chips" / "probes"), "--threshold",
         threshold, "--out", str(work / "crops.json")]
    )  # fmt: skip
    one = times["one_command"]
    one["gallery build"] = run(
        ["gallery", "build", args.model, str(photos / "gallery"), "--out",
         str(work / "gallery-photos"), "--overwrite", "--detector", "mtcnn", "--faces", "central"]
    )  # fmt: skip
    one["search"] = run(
        ["search", str(work / "gallery-photos"), str(photos / "probes"), "--threshold", threshold,
         "--out", str(work / "photos.json"), "--detector", "mtcnn", "--faces", "central"]
    )  # fmt: skip
    enrolled_set = set(enrolled)
    for path, key in (("crops.json", "two_commands"), ("photos.json", "one_command")):
        rows = json.loads((work / path).read_text())
        result[key] = score(rows, enrolled_set) | {"seconds": times[key]}
        result[key]["total_seconds"] = sum(times[key].values())  # type: ignore[index]
    text = json.dumps(result, indent=2)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
