"""Cross-check marginface's RecordIO and .bin files against MXNet itself, both ways.

MXNet is not a dependency (its last release needs NumPy < 1.24), so this runs in two
interpreters, sharing a scratch folder:

1. ``write`` (the project's venv): ``convert_folder`` of real ORL faces, ``convert_pairs`` of a
   small LFW pairs file, and a ``RecordWriter`` file of awkward payloads (the magic word at
   aligned and unaligned positions, empty records); a manifest (JSON) and the Pillow-decoded
   images (``.npy``) describe what was written.
2. ``mxnet`` (a venv with ``mxnet==1.9.1 numpy==1.23.5``): reads all of it with
   ``mx.recordio.MXIndexedRecordIO`` / ``unpack`` / ``mx.image.imdecode`` and insightface's
   ``MXFaceDataset`` index logic and its ``load_bin`` (``pickle.load(..., encoding="bytes")``),
   compares with the manifest, then writes its own ``.rec`` (the same awkward payloads and
   image records) for step 3.
3. ``read`` (the project's venv): reads MXNet's file with ``RecordReader`` and compares bytes.

Usage (from the repository root)::

    .venv/bin/python benchmarks/check_mxnet_compat.py write /tmp/mxcheck
    /path/to/mxenv/bin/python benchmarks/check_mxnet_compat.py mxnet /tmp/mxcheck
    .venv/bin/python benchmarks/check_mxnet_compat.py read /tmp/mxcheck

Each step prints what it checked and exits non-zero on the first mismatch.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import struct
import sys
from pathlib import Path

import numpy as np

MAGIC = struct.pack("<I", 0xCED7230A)
AWKWARD = [
    b"plain",
    b"abcd" + MAGIC + b"efgh" + MAGIC + b"xy",  # three parts
    MAGIC + b"zz",  # an empty first part
    b"",
    b"ab" + MAGIC + b"cd",  # unaligned: not split
    MAGIC * 3,
    bytes(range(256)) * 3,
]
REPO = Path(__file__).resolve().parents[1]
SHARED = REPO / ".." / "shared" / "data"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write(scratch: Path) -> None:
    import io
    import tarfile

    from PIL import Image

    from marginface.data.convert import convert_folder, convert_pairs
    from marginface.data.insightface import InsightFaceDataset
    from marginface.data.recordio import RecordReader, RecordWriter, unpack_image_record

    scratch.mkdir(parents=True, exist_ok=True)
    faces = scratch / "faces"
    with tarfile.open(SHARED / "orl" / "att_faces.tar") as tar:
        for subject in range(1, 6):
            (faces / f"s{subject:02d}").mkdir(parents=True, exist_ok=True)
            for number in range(1, 5):
                data = tar.extractfile(f"att_faces/s{subject}/{number}.pgm").read()
                Image.open(io.BytesIO(data)).save(faces / f"s{subject:02d}" / f"{number}.png")
    convert_folder(faces, scratch / "dataset", image_size=112)
    reader = RecordReader(scratch / "dataset" / "train.rec")
    records = {}
    for key in reader.keys.tolist():
        header, image = unpack_image_record(reader.read(key))
        label = header.label.tolist() if isinstance(header.label, np.ndarray) else header.label
        records[str(key)] = {
            "flag": header.flag,
            "label": label,
            "id": header.id,
            "id2": header.id2,
            "image": _sha(image),
        }
    dataset = InsightFaceDataset(scratch / "dataset", decoder="pillow")
    np.save(
        scratch / "images.npy", np.stack([dataset.read_item(i)[0] for i in range(len(dataset))])
    )

    lfw = scratch / "lfw"
    names: dict[str, int] = {}
    with tarfile.open(SHARED / "lfw" / "lfw-deepfunneled.tar.gz") as tar:
        for member in tar:
            if member.isfile() and member.name.endswith(".jpg"):
                name, file = member.name.split("/")[-2:]
                (lfw / name).mkdir(parents=True, exist_ok=True)
                (lfw / name / file).write_bytes(tar.extractfile(member).read())
                names[name] = names.get(name, 0) + 1
                if len([n for n, c in names.items() if c >= 2]) >= 2 and len(names) >= 4:
                    break
    two = [n for n, c in names.items() if c >= 2][:2]
    other = [n for n in names if n not in two][:2]
    lines = ["1\t2", f"{two[0]}\t1\t2", f"{two[1]}\t2\t1"]
    lines += [f"{two[0]}\t1\t{other[0]}\t1", f"{two[1]}\t1\t{other[1]}\t1"]
    (scratch / "pairs.txt").write_text("\n".join(lines) + "\n")
    convert_pairs(scratch / "pairs.txt", lfw, scratch / "dataset" / "lfw.bin")

    with RecordWriter(scratch / "awkward.rec") as writer:
        for key, payload in enumerate(AWKWARD):
            writer.write(key, payload)
    manifest = {
        "records": records,
        "awkward": [_sha(p) for p in AWKWARD],
        "awkward_bytes": _sha((scratch / "awkward.rec").read_bytes()),
        "num_images": len(dataset),
        "num_classes": dataset.num_classes,
        "labels": dataset.labels().tolist(),
        "bin_same": [True, True, False, False],
    }
    (scratch / "manifest.json").write_text(json.dumps(manifest))
    print(f"write: {len(records)} records, {len(dataset)} images, lfw.bin, awkward.rec")


def check_with_mxnet(scratch: Path) -> None:
    import mxnet as mx

    manifest = json.loads((scratch / "manifest.json").read_text())
    folder = scratch / "dataset"
    rec = mx.recordio.MXIndexedRecordIO(str(folder / "train.idx"), str(folder / "train.rec"), "r")
    assert sorted(rec.keys) == sorted(int(k) for k in manifest["records"]), "keys differ"
    for key, expected in manifest["records"].items():
        header, image = mx.recordio.unpack(rec.read_idx(int(key)))
        label = header.label.tolist() if header.flag > 0 else header.label
        got = [header.flag, label, header.id, header.id2, _sha(image)]
        want = [expected[f] for f in ("flag", "label", "id", "id2", "image")]
        assert got == want, f"record {key}: MXNet reads {got}, marginface wrote {want}"
    # insightface arcface_torch MXFaceDataset's index logic and item decoding
    header, _ = mx.recordio.unpack(rec.read_idx(0))
    assert header.flag > 0
    imgidx = np.array(range(1, int(header.label[0])))
    assert len(imgidx) == manifest["num_images"]
    reference = np.load(scratch / "images.npy")
    labels, worst = [], 0
    for position, index in enumerate(imgidx):
        header, image = mx.recordio.unpack(rec.read_idx(int(index)))
        label = header.label if isinstance(header.label, float) else header.label[0]
        labels.append(int(label))
        decoded = mx.image.imdecode(image).asnumpy()  # RGB
        worst = max(worst, int(np.abs(decoded.astype(int) - reference[position]).max()))
    assert labels == manifest["labels"], "labels differ"
    assert worst <= 2, f"MXNet's decoded pixels differ from Pillow's by {worst}"
    with open(folder / "property") as handle:
        assert int(handle.read().split(",")[0]) == manifest["num_classes"]
    # insightface's load_bin
    with open(folder / "lfw.bin", "rb") as handle:
        bins, issame = pickle.load(handle, encoding="bytes")
    assert list(issame) == manifest["bin_same"], "issame differs"
    shapes = {mx.image.imdecode(b).shape for b in bins}
    assert shapes == {(112, 112, 3)}, shapes
    # the awkward payloads, read by MXNet
    awkward = mx.recordio.MXIndexedRecordIO(
        str(scratch / "awkward.idx"), str(scratch / "awkward.rec"), "r"
    )
    got = [_sha(awkward.read_idx(k)) for k in range(len(manifest["awkward"]))]
    assert got == manifest["awkward"], "MXNet reads the awkward payloads differently"
    # MXNet writes the same payloads (bytes compared in step 3) and a few image records
    out = mx.recordio.MXIndexedRecordIO(
        str(scratch / "mx_awkward.idx"), str(scratch / "mx_awkward.rec"), "w"
    )
    for key, payload in enumerate(AWKWARD):
        out.write_idx(key, payload)
    out.write_idx(100, mx.recordio.pack(mx.recordio.IRHeader(0, 7.0, 100, 0), b"IMG"))
    out.write_idx(101, mx.recordio.pack(mx.recordio.IRHeader(0, [3.0, 1.0], 101, 5), MAGIC))
    out.close()
    print(
        f"mxnet {mx.__version__}: {len(manifest['records'])} records, {len(imgidx)} images "
        f"(max pixel difference {worst}), lfw.bin ({len(issame)} pairs) and "
        f"{len(AWKWARD)} awkward payloads read as written"
    )


def read_mxnet_file(scratch: Path) -> None:
    from marginface.data.recordio import RecordReader, encode_record, unpack_image_record

    manifest = json.loads((scratch / "manifest.json").read_text())
    reader = RecordReader(scratch / "mx_awkward.rec")
    got = [_sha(reader.read(k)) for k in range(len(AWKWARD))]
    assert got == manifest["awkward"], "marginface reads MXNet's payloads differently"
    framed = b"".join(encode_record(p) for p in AWKWARD)
    assert (scratch / "mx_awkward.rec").read_bytes().startswith(framed), "framing differs"
    assert _sha(framed) == manifest["awkward_bytes"]
    header, image = unpack_image_record(reader.read(100))
    assert (header.flag, header.label, header.id, image) == (0, 7.0, 100, b"IMG")
    header, image = unpack_image_record(reader.read(101))
    assert header.flag == 2 and header.label.tolist() == [3.0, 1.0] and header.id2 == 5
    assert image == MAGIC
    print("read: MXNet's file read back; its bytes equal marginface's RecordWriter output")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("write", "mxnet", "read"):
        sys.exit(__doc__)
    step = {"write": write, "mxnet": check_with_mxnet, "read": read_mxnet_file}[sys.argv[1]]
    step(Path(sys.argv[2]))
