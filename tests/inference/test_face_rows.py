"""The detected face kept with each embedded row (issue 47): the box, landmarks and score the
cutter found travel with the pixels through embed's decoding threads into the .npz, a resumed
run, FaceModel.embed_faces, a gallery's arrays and search's results; aligned crops give NaN
rows, a run without detector writes what it always wrote."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
from PIL import Image

from marginface.detect import Faces
from marginface.inference import FaceModel
from marginface.inference.face_rows import (
    DetectedFace,
    face_arrays,
    face_as_dict,
    faces_from_arrays,
    has_faces,
)
from marginface.inference.folder import embed_folder, read_embeddings
from marginface.inference.gallery import Gallery
from marginface.inference.photo_faces import FaceCutter

from ._digits import digit_images, write_identities


def expected_face(marker: int) -> DetectedFace:
    """The face the fake detector finds in a photo whose top-left pixel is ``marker``."""
    x, y = 1 + marker % 7, 2 + marker % 5
    box = np.array([x, y, x + 14.5, y + 15.25], np.float32)
    landmarks = np.array(
        [[x + 4, y + 5], [x + 10, y + 5], [x + 7, y + 8], [x + 5, y + 11], [x + 9, y + 11]],
        np.float32,
    ) + np.float32(marker / 1000)
    return DetectedFace(box, landmarks, marker / 255)


class MarkerDetector:
    """One face per photo, placed by the photo's top-left pixel (0: no face); sleeps a
    random moment so that threads finish out of order."""

    def __init__(self) -> None:
        self.random = random.Random(0)

    def detect(self, images):
        found = []
        for image in images:
            time.sleep(self.random.random() * 0.004)
            marker = int(image[0, 0, 0])
            if marker == 0:
                found.append(Faces.empty())
                continue
            face = expected_face(marker)
            found.append(
                Faces(face.box[None], np.array([face.score], np.float32), face.landmarks[None])
            )
        return found


def photo(marker: int, digit: np.ndarray) -> np.ndarray:
    """A 24x24 grey photo holding ``digit`` (8x8, scaled up) with ``marker`` top-left."""
    image = np.kron(digit, np.ones((3, 3), np.uint8)).astype(np.uint8)
    image[0, 0] = marker
    return image


@pytest.fixture
def detecting(digits_run):
    plain = FaceModel(digits_run, batch_size=3)
    cutter = FaceCutter(MarkerDetector(), crop="mtcnn-box", size=8, faces="largest")
    return FaceModel.from_module(plain.module, plain.description, batch_size=3, aligner=cutter)


def write_photos(folder, markers) -> dict[str, int]:
    """``folder/<identity>/<marker>.png`` photos; returns ``{relative path: marker}``."""
    pixels, _ = digit_images()
    written = {}
    for k, marker in enumerate(markers):
        relative = f"{k % 3}/{marker}.png"
        (folder / str(k % 3)).mkdir(parents=True, exist_ok=True)
        Image.fromarray(photo(marker, pixels[k])).save(folder / relative)
        written[relative] = marker
    return written


def test_detected_face_checks_and_arrays_round_trip():
    face = expected_face(40)
    arrays = face_arrays([face, None])
    assert arrays["boxes"].dtype == np.float32 and arrays["landmarks"].shape == (2, 5, 2)
    assert np.isnan(arrays["boxes"][1]).all() and np.isnan(arrays["scores"][1])
    back = faces_from_arrays(arrays["boxes"], arrays["landmarks"], arrays["scores"])
    assert back[1] is None and has_faces(back) and not has_faces([None])
    np.testing.assert_array_equal(back[0].box, face.box)
    np.testing.assert_array_equal(back[0].landmarks, face.landmarks)
    assert face_as_dict(face)["box"] == [float(v) for v in face.box]
    with pytest.raises(ValueError, match=r"box must hold 4 numbers"):
        DetectedFace(np.zeros(3), np.zeros((5, 2)), 1.0)
    with pytest.raises(ValueError, match=r"landmarks must be \(5, 2\)"):
        DetectedFace(np.zeros(4), np.zeros((4, 2)), 1.0)
    with pytest.raises(ValueError, match=r"scores must be \(2,\)"):
        faces_from_arrays(arrays["boxes"], arrays["landmarks"], arrays["scores"][:1])


def test_threads_keep_each_row_with_its_own_face(detecting, tmp_path):
    folder = tmp_path / "photos"
    markers = write_photos(folder, range(11, 60, 4))  # 13 photos, each its own face
    write_photos(tmp_path / "faceless", [0])
    (folder / "x").mkdir()
    (folder / "x" / "none.png").write_bytes((tmp_path / "faceless" / "0" / "0.png").read_bytes())
    write_identities(folder / "crops", [5], 2)  # aligned 8x8 crops: taken as they are
    out = tmp_path / "e.npz"
    result = embed_folder(detecting, folder, out, workers=4)
    assert result.skipped == [("x/none.png", "no face found in a 24x24 photo")]
    saved = read_embeddings(out)
    paths = list(saved["paths"])
    assert result.total == len(paths) == 15
    for i, path in enumerate(paths):
        if path.startswith("crops/"):
            assert np.isnan(saved["boxes"][i]).all() and np.isnan(saved["scores"][i])
            assert np.isnan(saved["landmarks"][i]).all()
            continue
        face = expected_face(markers[path])
        np.testing.assert_array_equal(saved["boxes"][i], face.box)
        np.testing.assert_array_equal(saved["landmarks"][i], face.landmarks)
        assert saved["scores"][i] == np.float32(face.score)
    assert saved["boxes"].dtype == np.float32 and saved["landmarks"].shape == (15, 5, 2)
    np.testing.assert_allclose(
        saved["embeddings"], detecting.embed([str(folder / p) for p in paths]), atol=1e-6
    )


def test_a_resumed_run_keeps_the_faces_of_both_runs(detecting, digits_run, tmp_path):
    folder = tmp_path / "photos"
    write_identities(folder, [1, 2], 2)  # crops, embedded first without a detector
    out = tmp_path / "e.npz"
    embed_folder(FaceModel(digits_run), folder, out, workers=2)
    assert "boxes" not in read_embeddings(out)
    markers = write_photos(folder, [21, 33, 45, 57])
    real, calls = detecting.embed_pixels, []

    def dies_on_the_second_batch(pixels):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(pixels)

    detecting.embed_pixels = dies_on_the_second_batch
    with pytest.raises(KeyboardInterrupt):
        embed_folder(detecting, folder, out, workers=2, flush_every=1)
    detecting.embed_pixels = real
    result = embed_folder(detecting, folder, out, workers=2)
    assert (result.already, result.embedded, result.total) == (7, 1, 8)
    saved = read_embeddings(out)
    for i, path in enumerate(saved["paths"]):
        if path in markers:
            np.testing.assert_array_equal(saved["boxes"][i], expected_face(markers[path]).box)
        else:
            assert np.isnan(saved["boxes"][i]).all()


def test_without_a_detector_the_file_is_what_it_was(digits_run, tmp_path):
    folder = write_identities(tmp_path / "f", [0, 1], 2)
    out = tmp_path / "e.npz"
    embed_folder(FaceModel(digits_run), folder, out)
    with np.load(out) as data:
        assert sorted(data.files) == ["description", "embeddings", "identities", "key", "paths"]
    assert sorted(read_embeddings(out)) == [
        "description",
        "embeddings",
        "identities",
        "key",
        "paths",
    ]  # no face arrays (the key: the model's, issue 45)


def test_damaged_face_arrays_are_one_line(digits_run, tmp_path):
    folder = write_identities(tmp_path / "f", [0], 2)
    out = tmp_path / "e.npz"
    embed_folder(FaceModel(digits_run), folder, out)
    with np.load(out) as data:
        arrays = dict(data)
    np.savez(out, **arrays, boxes=np.zeros((1, 4)), landmarks=np.zeros((2, 5, 2)), scores=[1, 2])
    with pytest.raises(ValueError, match=r"not an embeddings file .*boxes must be \(2, 4\)"):
        read_embeddings(out)


def test_embed_faces_and_verify_return_the_faces(detecting, tmp_path):
    pixels, _ = digit_images()
    photos = [np.repeat(photo(m, pixels[m])[:, :, None], 3, axis=2) for m in (30, 90)]
    found = detecting.embed_faces([photos[0], pixels[5], photos[1]])
    assert found.embeddings.shape == (3, detecting.embedding_dim)
    np.testing.assert_allclose(
        found.embeddings, detecting.embed([photos[0], pixels[5], photos[1]]), atol=1e-6
    )
    assert found.faces[1] is None and np.isnan(found.boxes[1]).all()
    np.testing.assert_array_equal(
        found.boxes[[0, 2]], [expected_face(30).box, expected_face(90).box]
    )
    np.testing.assert_array_equal(found.landmarks[2], expected_face(90).landmarks)
    np.testing.assert_allclose(found.scores[[0, 2]], [30 / 255, 90 / 255], rtol=1e-6)
    answer = detecting.verify(photos[0], pixels[5])
    np.testing.assert_array_equal(answer.faces[0].box, expected_face(30).box)
    assert answer.faces[1] is None
    with pytest.raises(ValueError, match="no face found in a 24x24 photo"):
        detecting.embed_faces(photo(0, pixels[0]))


def test_gallery_keeps_each_detected_face_and_search_shows_the_probes(detecting, tmp_path):
    pixels, _ = digit_images()
    rows = detecting.embed_faces([photo(m, pixels[m]) for m in (12, 24)] + [pixels[3]])
    gallery = Gallery(detecting.description)
    gallery.add(["a", "a", "b"], rows.embeddings, paths=["p/12", "p/24", "p/3"], faces=rows.faces)
    assert [(name, path) for name, path, _ in gallery.faces] == [("a", "p/12"), ("a", "p/24")]
    gallery.save(tmp_path / "g")
    loaded = Gallery.load(tmp_path / "g")
    assert [(n, p) for n, p, _ in loaded.faces] == [("a", "p/12"), ("a", "p/24")]
    np.testing.assert_array_equal(loaded.faces[1][2].landmarks, expected_face(24).landmarks)
    arrays_file = next((tmp_path / "g").glob("arrays-*.npz"))
    with np.load(arrays_file) as data:
        arrays = dict(data)
    np.savez(tmp_path / "g" / arrays_file.name, **{**arrays, "face_scores": np.zeros(3)})
    with pytest.raises(ValueError, match=r"arrays .* are unreadable \(face_scores must be"):
        Gallery.load(tmp_path / "g")
    np.savez(tmp_path / "g" / arrays_file.name, **arrays)
    loaded.remove(["a"])
    assert loaded.faces == []
    loaded.save(tmp_path / "g")
    with np.load(next((tmp_path / "g").glob("arrays-*.npz"))) as data:
        assert data.files == ["sums"]  # no detected face left: as a gallery always was
    results = gallery.search(rows.embeddings, ["x", "y", "z"], k=1, faces=rows.faces)
    assert results[2].face is None and "face" not in results[2].as_dict()
    assert results[0].as_dict()["face"]["box"] == [float(v) for v in expected_face(12).box]
    with pytest.raises(ValueError, match=r"2 faces for 3 probes"):
        gallery.search(rows.embeddings, ["x", "y", "z"], faces=rows.faces[:2])
    with pytest.raises(ValueError, match=r"faces needs paths"):
        gallery.add(["a"], rows.embeddings[:1], faces=rows.faces[:1])


def test_parquet_keeps_the_faces_in_columns(detecting, digits_run, tmp_path):
    pyarrow_parquet = pytest.importorskip("pyarrow.parquet")
    folder = write_identities(tmp_path / "photos", [1], 2)
    out = tmp_path / "e.parquet"
    embed_folder(FaceModel(digits_run), folder, out)
    assert pyarrow_parquet.read_table(out).column_names == ["path", "identity", "embedding"]
    markers = write_photos(folder, [21, 33, 45])
    result = embed_folder(detecting, folder, out, workers=3)
    assert (result.already, result.embedded) == (2, 3)
    table = pyarrow_parquet.read_table(out)
    assert table.column_names[3:] == ["box", "landmarks", "score"]
    assert table.column("box").null_count == 2  # the crops of the first run
    saved = read_embeddings(out)
    for i, path in enumerate(saved["paths"]):
        if path in markers:
            np.testing.assert_array_equal(
                saved["landmarks"][i], expected_face(markers[path]).landmarks
            )
        else:
            assert np.isnan(saved["boxes"][i]).all()
