"""The guide's troubleshooting chapter (guide/src/troubleshooting.md) quotes
the compiler's words: every quoted error (a code span starting with `error`)
appears in the ui case's `.stderr` its paragraph names, and that file
exists."""

import pathlib
import re

from doc_text import chapter

ROOT = pathlib.Path(__file__).resolve().parents[2]
UI = ROOT / "ui-tests" / "tests" / "ui" / "fail"


def section():
    return chapter("troubleshooting")


def test_every_quoted_error_is_in_its_stderr():
    items = re.split(r"\n- ", section())[1:]
    checked = 0
    for item in items:
        files = re.findall(r"`(\w+\.stderr)`", item)
        quotes = [q.strip() for q in re.findall(r"``(.+?)``", item.replace("\n  ", " "))
                  if q.strip().startswith("error")]
        if not quotes:
            continue
        assert files, f"no .stderr named for {quotes}"
        text = " ".join((UI / f).read_text() for f in files)
        for q in quotes:
            assert q in text, f"{q!r} is not in {files}"
            checked += 1
    assert checked >= 5


def test_the_forgotten_attribute_error_is_short():
    # At most 40 lines, naming the attribute to write.
    text = (UI / "view_without_dlpack_fn.stderr").read_text()
    assert len(text.splitlines()) <= 40
    assert "#[dlcast::pyfunction]" in text.splitlines()[0]


def test_a_view_kept_or_sent_away_names_the_fix_in_one_short_error():
    # A view as a `#[pyclass]` field, or moved into `py.detach` or a thread:
    # one error (not one for `Send` and one for `Sync`), at most 40 lines,
    # whose first line names `ArrayHandle` and the slice.
    for name in ("view_in_pyclass", "view_in_detach", "view_in_thread"):
        lines = (UI / f"{name}.stderr").read_text().splitlines()
        assert len(lines) <= 40, name
        assert sum(line.startswith("error") for line in lines) == 1, name
        assert "ArrayHandle<T>" in lines[0] and "slice" in lines[0], name
