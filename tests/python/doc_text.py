"""Where the documentation lives, for the tests that check what it says:
the README (the front door) and the guide's chapters (guide/src/*.md, in
the order guide/src/SUMMARY.md lists them)."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
GUIDE = ROOT / "guide" / "src"


def chapters():
    """The chapter files SUMMARY.md links, in its order."""
    summary = (GUIDE / "SUMMARY.md").read_text()
    return [GUIDE / name for name in re.findall(r"\]\(([^)#]+\.md)\)", summary)]


def chapter(name):
    """The text of one chapter, `guide/src/<name>.md`."""
    return (GUIDE / f"{name}.md").read_text()


def documents():
    """README.md and every chapter: the files whose blocks and links are checked."""
    return [README, *chapters()]


def all_text():
    """README.md and the guide, one text: for a fact that may sit anywhere."""
    return "\n\n".join(path.read_text() for path in documents())
