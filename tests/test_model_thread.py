"""The model thread (issue 47): calls from the main thread run on one worker thread, with the
caller's intra-op thread count, and give the same numbers bit for bit; calls from other
threads run where they are."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from marginface._model_thread import on_model_thread
from marginface.data.face_photos import detect_photos, list_photos
from marginface.detect import MTCNN
from marginface.inference import FaceModel
from marginface.models.catalogue import find_pretrained, pretrained_file
from tests._face_fixtures import lfw_jpegs, lfw_rgb, mtcnn_weights

__all__ = ["lfw_jpegs", "lfw_rgb", "mtcnn_weights"]  # fixtures


def _where() -> str:
    return threading.current_thread().name


def test_a_call_from_the_main_thread_runs_on_the_model_thread():
    assert threading.current_thread() is threading.main_thread()
    first, second = on_model_thread(_where), on_model_thread(_where)
    assert first.startswith("marginface-model") and first == second  # one thread, kept
    assert on_model_thread(lambda a, *, b: a + b, 2, b=3) == 5


def test_a_call_from_another_thread_runs_there():
    with ThreadPoolExecutor(1, thread_name_prefix="mine") as pool:
        assert pool.submit(on_model_thread, _where).result().startswith("mine")


def test_the_callers_thread_count_is_carried_over():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert on_model_thread(torch.get_num_threads) == 1
        torch.set_num_threads(before)
        assert on_model_thread(torch.get_num_threads) == before
    finally:
        torch.set_num_threads(before)


def test_an_error_is_raised_in_the_caller():
    def fails() -> None:
        raise KeyError("inside")

    with pytest.raises(KeyError, match="inside"):
        on_model_thread(fails)


def test_function_must_be_callable():
    with pytest.raises(TypeError, match="function must be callable, got int"):
        on_model_thread(3)


def test_detection_and_embeddings_are_bit_equal_to_the_main_threads(lfw_rgb, mtcnn_weights):
    if pretrained_file(find_pretrained("dlib-resnet-v1")) is None:
        pytest.skip("face_recognition_models (the dlib-weights extra) is not installed")
    model = FaceModel("dlib-resnet-v1", detector="mtcnn")
    photo = lfw_rgb[0]
    here = model._embed_here(photo)  # on the main thread, as before the model thread
    hopped = model._embed_with_faces(photo)
    assert torch.equal(here[0], hopped[0])
    np.testing.assert_array_equal(here[1][0].box, hopped[1][0].box)
    np.testing.assert_array_equal(here[1][0].landmarks, hopped[1][0].landmarks)
    crop = model.aligner(photo)
    pixels = torch.from_numpy(np.ascontiguousarray(crop.transpose(2, 0, 1)))[None]
    assert torch.equal(model._embed_pixels_here(pixels), model.embed_pixels(pixels))


def test_align_detects_on_the_model_thread_with_the_main_threads_boxes(
    lfw_jpegs, lfw_rgb, mtcnn_weights, tmp_path
):
    for name, data in list(lfw_jpegs.items())[:2]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    seen: list[str] = []
    detector = MTCNN()
    detect = detector.detect

    def spied(images):
        seen.append(_where())
        return detect(images)

    detector.detect = spied
    photos = list_photos(tmp_path)
    found = [faces for _, _, faces in detect_photos(photos, detector, workers=1)]
    assert seen and all(name.startswith("marginface-model") for name in seen)
    direct = detect(lfw_rgb[:2])  # on the main thread, as before the model thread
    assert len(found) == 2
    for got, want in zip(found, direct, strict=True):
        np.testing.assert_array_equal(got.boxes, want.boxes)
        np.testing.assert_array_equal(got.landmarks, want.landmarks)


def test_a_forked_child_makes_its_own_model_thread():
    import multiprocessing

    on_model_thread(_where)  # the parent's thread exists before the fork
    context = multiprocessing.get_context("fork")
    with context.Pool(1) as pool:  # the pool's worker runs the call on its own main thread
        result = pool.apply_async(_in_a_fresh_main_thread)
        assert result.get(timeout=30).startswith("marginface-model")


def _in_a_fresh_main_thread() -> str:
    # a fork Pool worker runs its tasks on its main thread: the call hops there too
    assert threading.current_thread() is threading.main_thread()
    return on_model_thread(_where)
