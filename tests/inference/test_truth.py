"""``search --truth``: the probes' identities from their folders or a probe,identity CSV, and
one line for each malformed input."""

from __future__ import annotations

import pytest

from marginface.inference.truth import read_truth

PROBES = ["alice/1.jpg", "alice/2.jpg", "bob/1.jpg"]


def test_folders_name_the_identities():
    assert read_truth("folders", PROBES) == ["alice", "alice", "bob"]
    with pytest.raises(ValueError, match=r"the probe 'x.jpg' is not in an identity folder"):
        read_truth("folders", ["alice/1.jpg", "x.jpg"])


def test_a_csv_with_or_without_header_and_the_folder_in_front(tmp_path):
    path = tmp_path / "truth.csv"
    path.write_text("probe,identity\nalice/1.jpg,Alice\n\nbob/1.jpg , Bob\n./alice/2.jpg,Alice\n")
    assert read_truth(path, PROBES) == ["Alice", "Alice", "Bob"]
    root = tmp_path / "photos"
    rows = [f"{root}/alice/1.jpg,A", "alice/2.jpg,A", "bob/1.jpg,B", "carol/1.jpg,C"]
    path.write_text("\n".join(rows) + "\n")  # extra rows (carol) are fine
    assert read_truth(path, PROBES, root=root) == ["A", "A", "B"]
    rows = ["photos/alice/1.jpg,A", "photos/alice/2.jpg,A", "bob/1.jpg,B"]
    path.write_text("\n".join(rows) + "\n")  # as given on the command line: search photos
    assert read_truth(path, PROBES, root="photos") == ["A", "A", "B"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("alice/1.jpg\n", r"row 1: expected 'probe,identity', got 'alice/1.jpg'"),
        ("alice/1.jpg,A,extra\n", r"row 1: expected 'probe,identity', got 'alice/1.jpg,A,extra'"),
        ("alice/1.jpg,A\nbob/1.jpg,\n", r"row 2: expected 'probe,identity', got 'bob/1.jpg,'"),
        ("alice/1.jpg,A\nalice/1.jpg,B\n", r"row 2: 'alice/1.jpg' is given two identities, 'A'"),
        ("probe,identity\n", r"holds no probe,identity row"),
        ("alice/1.jpg,A\nbob/1.jpg,B\n", r"gives no identity for 1 of the 3 probes \(first: "),
    ],
)
def test_malformed_truth_is_one_line(tmp_path, text, message):
    path = tmp_path / "truth.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as error:
        read_truth(path, PROBES)
    assert len(str(error.value).splitlines()) == 1 and str(path) in str(error.value)


def test_no_such_file_or_unreadable(tmp_path):
    with pytest.raises(ValueError, match=r"no such file \(give 'folders', or a CSV"):
        read_truth(tmp_path / "none.csv", PROBES)
    (tmp_path / "bin.csv").write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(ValueError, match=r"bin.csv: cannot be read"):
        read_truth(tmp_path / "bin.csv", PROBES)
