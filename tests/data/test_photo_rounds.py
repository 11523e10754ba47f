"""detect_photos decodes photos in rounds bounded in count and in pixels: a folder of huge
photos is never held 32 at a time."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from PIL import Image

from marginface.data import face_photos


def test_rounds_are_bounded_in_pixels(tmp_path, monkeypatch):
    sizes = [(100, 100), (300, 200), (50, 40), (400, 400), (10, 10), (90, 90)]
    photos = []
    for i, size in enumerate(sizes):
        path = tmp_path / f"{i}.png"
        Image.new("RGB", size).save(path)
        photos.append((path, path.name))
    (tmp_path / "bad.png").write_bytes(b"not an image")
    photos.append((tmp_path / "bad.png", "bad.png"))  # 0 pixels: read_photo names it later
    monkeypatch.setattr(face_photos, "_CHUNK_PIXELS", 70_000)
    monkeypatch.setattr(face_photos, "_CHUNK", 4)
    with ThreadPoolExecutor(2) as pool:
        rounds = [[name for _, name in chunk] for chunk in face_photos._chunks(photos, pool)]
    # 10,000 + 60,000 fit; + 2,000 would pass 70,000; 160,000 alone (above the bound); then
    # the count bound (4) starts a new group: 100 + 8,100 + 0
    assert rounds == [["0.png", "1.png"], ["2.png"], ["3.png"], ["4.png", "5.png", "bad.png"]]
    assert [p for r in rounds for p in r] == [name for _, name in photos]
