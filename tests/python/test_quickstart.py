"""The README's quick start is the crate in examples/quickstart: its three
files appear in the README word for word, and its Python session gives the
output the README shows (`make ext` builds the module)."""

import doctest
import pathlib
import re

import numpy as np
import pytest
import quickstart

ROOT = pathlib.Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart"
FILES = ["Cargo.toml", "pyproject.toml", "src/lib.rs"]


def quickstart_section():
    readme = (ROOT / "README.md").read_text()
    start = readme.index("\n## Quick start\n")
    end = readme.index("\n## ", start + 1)
    return readme[start:end]


def fenced_blocks(text):
    """(label, language, body) for every fenced block: the label is the
    `name` of a paragraph "`name`:" just above the block, else None."""
    pattern = re.compile(r"(?:^`([^`\n]+)`:\n\n)?^```(\w*)\n(.*?)^```$", re.M | re.S)
    return [m.groups() for m in pattern.finditer(text)]


def test_readme_shows_the_quickstart_files_verbatim():
    shown = {label: (lang, body) for label, lang, body in fenced_blocks(quickstart_section()) if label}
    assert sorted(shown) == sorted(FILES)
    for name in FILES:
        lang, body = shown[name]
        assert lang == ("rust" if name.endswith(".rs") else "toml"), name
        assert body == as_shown(name), f"README's {name} differs from examples/quickstart/{name}"


# The one line in which the README's Cargo.toml differs from the crate here:
# a user's project takes dlcast from its repository, this crate from the
# checkout it sits in (CI builds offline).
IN_REPOSITORY = 'dlcast-runtime = { path = "../../dlcast-runtime" }\n'
FOR_USERS = 'dlcast-runtime = { git = "https://github.com/dlcast/dlcast" }\n'


def as_shown(name):
    """The quick-start file as the README must show it."""
    text = (QUICKSTART / name).read_text()
    if name == "Cargo.toml":
        assert text.count(IN_REPOSITORY) == 1, "examples/quickstart/Cargo.toml no longer takes the runtime by path"
        text = text.replace(IN_REPOSITORY, FOR_USERS)
    return text


def test_readme_dependency_line_needs_no_publication():
    """The shown dependency resolves before the crates are published: a
    git dependency on the repository the workspace names, with the
    crates.io line kept as a comment for later."""
    cargo = as_shown("Cargo.toml")
    deps = [line for line in cargo.splitlines() if line.startswith("dlcast-runtime")]
    assert deps == [FOR_USERS.strip()]
    workspace = (ROOT / "Cargo.toml").read_text()
    assert 'repository = "https://github.com/dlcast/dlcast"' in workspace
    assert '# once it is published: dlcast-runtime = "0.1"' in cargo


def test_readme_session_runs_as_shown():
    sessions = [body for _, lang, body in fenced_blocks(quickstart_section()) if lang == "python"]
    assert len(sessions) == 1
    test = doctest.DocTestParser().get_doctest(sessions[0], {}, "README quick start", "README.md", 0)
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.attempted >= 4
    assert result.failed == 0


def test_module_checks_its_arguments():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert quickstart.row_sums(x).tolist() == [3.0, 12.0]
    with pytest.raises(TypeError, match=r"row_sums\(\): argument 'x': expected shape \(rows, _\), got \(3,\)"):
        quickstart.row_sums(np.ones(3, np.float32))
    read_only = np.ones(3, np.float32)
    read_only.flags.writeable = False
    with pytest.raises(TypeError, match=r"scale\(\): argument 'x'"):
        quickstart.scale(read_only, 2.0)
    assert read_only.tolist() == [1.0, 1.0, 1.0]
