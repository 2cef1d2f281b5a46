"""The README and the guide (guide/src, built by `make guide`) say what the
code does: the README stays short, every chapter SUMMARY.md names exists and
compiles as a doctest module of dlcast-runtime (its Rust blocks run in
`cargo test`), every relative link resolves, every block is fenced with its
language, and every Python session gives the output it shows."""

import doctest
import re

import numpy as np
import pytest
import torch

import dlcast_testext as ext
import quickstart
from doc_text import GUIDE, README, ROOT, chapters, documents

README_MAX_LINES = 250
LANGUAGES = {"rust", "python", "sh", "toml", "text"}


def rel(path):
    return path.relative_to(ROOT).as_posix()


def test_readme_is_at_most_250_lines():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move text into the guide"


def test_summary_names_every_chapter_and_each_exists():
    named = chapters()
    assert len(named) >= 10
    missing = [rel(p) for p in named if not p.is_file()]
    assert not missing, f"SUMMARY.md names chapters that do not exist: {missing}"
    on_disk = {p for p in GUIDE.glob("*.md") if p.name != "SUMMARY.md"}
    unlisted = sorted(rel(p) for p in on_disk - set(named))
    assert not unlisted, f"chapters SUMMARY.md does not name (mdBook would leave them out): {unlisted}"


def test_every_chapter_is_a_doctest_module():
    """Each chapter's Rust blocks compile in `cargo test` only if lib.rs
    includes it (and the README is the crate documentation)."""
    lib = (ROOT / "dlcast-runtime" / "src" / "lib.rs").read_text()
    assert '#![doc = include_str!("../README.md")]' in lib
    guide_mod = lib[lib.index("#[cfg(doctest)]\nmod guide {"):]
    included = re.findall(r'include_str!\("\.\./\.\./guide/src/([^"]+)"\)', guide_mod)
    assert sorted(included) == sorted(p.name for p in chapters())


def fenced(text):
    """(line number, language, body) of every fenced block."""
    blocks, lines, i = [], text.splitlines(keepends=True), 0
    while i < len(lines):
        m = re.match(r"```(\S*)\s*$", lines[i])
        if m:
            start, body = i + 1, []
            i += 1
            while not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            blocks.append((start, m.group(1), "".join(body)))
        i += 1
    return blocks


@pytest.mark.parametrize("path", documents(), ids=rel)
def test_every_block_names_its_language(path):
    # An unlabelled block is Rust to rustdoc: a shell or Python block left
    # bare would fail the doctests, a Rust one would hide its language.
    wrong = [(line, lang) for line, lang, _ in fenced(path.read_text()) if lang not in LANGUAGES]
    assert not wrong, f"{rel(path)}: blocks fenced without one of {sorted(LANGUAGES)}: {wrong}"


def prose(text):
    """The text outside fenced blocks and code spans."""
    text = re.sub(r"^```.*?^```$", "", text, flags=re.M | re.S)
    return re.sub(r"``.+?``|`[^`\n]+`", "", text)


def anchors(path):
    """The anchors of a file's headings as GitHub and mdBook write them."""
    text = re.sub(r"^```.*?^```$", "", path.read_text(), flags=re.M | re.S)
    ids = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        ids.add(slug)
    return ids


def links(path):
    text = prose(path.read_text())
    inline = re.findall(r"\]\(([^)\s]+)\)", text)
    reference = re.findall(r"^\[[^\]]+\]:\s*(\S+)", text, re.M)
    return inline + reference


@pytest.mark.parametrize("path", documents(), ids=rel)
def test_relative_links_resolve(path):
    broken, checked = [], 0
    for target in links(path):
        if re.match(r"[a-z]+:", target):
            continue  # a URL
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        checked += 1
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(target)
    assert not broken, f"{rel(path)}: links that do not resolve: {broken}"
    if path == README:
        assert checked >= 15  # the README links every chapter


def test_link_check_sees_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[a](missing.md), [b](#title), [c](#nowhere), `[d](x.md)`\n")
    assert links(page) == ["missing.md", "#title", "#nowhere"]
    assert anchors(page) == {"title"}


# Every Python session (a `python` block with `>>>` prompts) of the README
# and the guide, keyed by its file and its first line, with the names it
# uses. The README's `centroid` is the test extension's (the same
# constraints and result, read through `TensorRef`s; its docstring is the
# one the guide prints). A session not listed here fails the test below:
# list it with the module it uses.
SESSIONS = {
    ("README.md", ">>> centroid(np.array([[0, 0, 0], [1, 2, 3]], np.float32), torch.ones(2))"):
        lambda: {"np": np, "torch": torch, "centroid": ext.centroid},
    ("README.md", ">>> import numpy as np, torch, quickstart"):
        lambda: {"quickstart": quickstart},
    ("guide/src/types-and-stubs.md", ">>> print(centroid.__doc__)"):
        lambda: {"centroid": ext.centroid},
    ("guide/src/ownership.md", ">>> import numpy as np"):
        lambda: {"Projection": ext.Projection},
}


def python_blocks():
    for path in documents():
        for line, lang, body in fenced(path.read_text()):
            if lang == "python":
                yield path, line, body


def sessions():
    return [(rel(p), body.splitlines()[0], body) for p, _, body in python_blocks() if body.startswith(">>>")]


def test_every_session_is_listed():
    found = {(name, first) for name, first, _ in sessions()}
    assert found == set(SESSIONS), f"sessions found {sorted(found)}, listed {sorted(SESSIONS)}"


@pytest.mark.parametrize("name,first,body", sessions(), ids=lambda v: v if len(v) < 40 else v[:40])
def test_session_gives_the_output_shown(name, first, body):
    names = SESSIONS[(name, first)]()
    test = doctest.DocTestParser().get_doctest(body, names, f"{name}: {first}", name, 0)
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    runner.run(test, clear_globs=False)
    result = runner.summarize(verbose=False)
    assert result.attempted >= 1
    assert result.failed == 0, f"{name}: the session's output differs (see the report above)"


@pytest.mark.parametrize("path,line,body", [b for b in python_blocks() if not b[2].startswith(">>>")],
                         ids=lambda v: rel(v) if hasattr(v, "relative_to") else str(v)[:20])
def test_python_blocks_that_are_not_sessions_parse(path, line, body):
    # Stub excerpts and scripts: no output to compare, but valid Python.
    compile(body, f"{rel(path)}:{line}", "exec")


def test_the_benchmark_headline_has_its_place_in_the_performance_chapter():
    # bench/run.py writes its headline between these markers, in the file it
    # names; without them it only warns.
    run = (ROOT / "bench" / "run.py").read_text()
    start = re.search(r'^README_START = "(.+)"$', run, re.M).group(1)
    end = re.search(r'^README_END = "(.+)"$', run, re.M).group(1)
    assert 'HEADLINE_PATH = ROOT / "guide" / "src" / "performance.md"' in run
    text = (GUIDE / "performance.md").read_text()
    assert text.count(start) == 1 and text.count(end) == 1 and text.index(start) < text.index(end)


def test_the_stored_array_example_is_the_test_extensions():
    # The guide's `Projection` (ownership.md) is the class its session runs
    # (tests/src/stored.rs): the block's lines, hidden ones left out, appear
    # there in one piece.
    text = (GUIDE / "ownership.md").read_text()
    block = next(body for _, lang, body in fenced(text) if lang == "rust" and "struct Projection" in body)
    shown = "".join(line for line in block.splitlines(keepends=True) if not line.startswith("# "))
    source = (ROOT / "tests" / "src" / "stored.rs").read_text()
    assert shown in source
