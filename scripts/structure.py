"""The structure rules of the two published crates, checked (`make lint`).

- No function in `dlcast-runtime/src` or `dlcast-macros/src` is over
  80 lines, from the line of its `fn` to that of its closing brace.
- No import circle between the parts of any module (the files and folders
  directly inside it, a folder standing for everything in it): a file
  depends on another when it names an item defined there (`use`, or a path
  in code through `crate::`, `super::`, `self::` or a child module; a
  `pub use` re-export is followed to where the item is defined, and is no
  dependency itself), and a part depends on another when a file in it
  depends on a file in the other. A module and its own descendants are one
  part: a folder's `mod.rs` and its files may name each other's items.

`python scripts/structure.py` prints what breaks a rule and exits 1;
`--report` prints the longest functions and every file's dependencies.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CRATES = ["dlcast-runtime/src", "dlcast-macros/src"]
MAX_LINES = 80


def strip(text: str) -> str:
    """The text with comments, strings and char literals blanked (newlines
    kept), so that braces and paths are the code's own."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif (m := re.match(r'(?:b|c)?r(#*)"', text[i:i + 10])) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = '"' + m.group(1)
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(re.sub(r"[^\n]", " ", text[i:j + 1]))
            i = j + 1
        elif c == "'" and (m := re.match(r"'(\\.[^']*|[^\\'])'", text[i:i + 12])):
            out.append(" " * m.end())
            i += m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def files() -> dict[str, Path]:
    """Every source file of both crates, by its module path
    (`runtime::import::torch`)."""
    found = {}
    for crate in CRATES:
        base = ROOT / crate
        name = crate.split("/")[0].removeprefix("dlcast-")
        for path in sorted(base.rglob("*.rs")):
            if path.is_symlink():
                continue
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] in ("mod", "lib"):
                parts.pop()
            found["::".join([name, *parts])] = path
    return found


def closing_brace(code: str, opening: int) -> int:
    """The index of the brace closing the one at `opening` (the end of the
    code if none does)."""
    level, k = 0, opening
    while k < len(code):
        if code[k] == "{":
            level += 1
        elif code[k] == "}":
            level -= 1
            if not level:
                break
        k += 1
    return k


FN = re.compile(r"\bfn\s+(\$?\w+)|(?<![|\w])(?:move\s+)?\|[^|\n;]*\|\s*(?:->\s*[\w:<>&' ]+?\s*)?(?=\{)")


def long_functions(path: Path) -> list[tuple[str, int, int]]:
    """(name, first line, lines) of every function with a body."""
    code = strip(path.read_text())
    out = []
    for m in FN.finditer(code):
        start = m.start()
        # The body's opening brace: the first `{` or `;` at depth 0 of
        # brackets after the signature.
        depth, j = 0, m.end()
        while j < len(code):
            ch = code[j]
            if ch in "(<[":
                depth += 1
            elif ch in ")>]":
                depth -= 1 if not code.startswith("->", j - 1) else 0
            elif ch == ";" and depth <= 0:
                j = -1
                break
            elif ch == "{" and depth <= 0:
                break
            j += 1
        if j < 0 or j >= len(code):
            continue
        k = closing_brace(code, j)
        first = code.count("\n", 0, start) + 1
        last = code.count("\n", 0, k) + 1
        out.append((m.group(1) or "closure", first, last - first + 1))
    return out


USE = re.compile(r"\buse\s+([^;]*);")
PATH = re.compile(r"\b((?:crate|super|self)(?:\s*::\s*\w+)+)")


def use_paths(code: str) -> list[tuple[str, int, bool]]:
    """The paths a file names, with where and whether a `pub use`
    re-exports them: `use` trees expanded, and paths in code."""
    paths = []

    def expand(prefix: str, tree: str, pos: int, public: bool) -> None:
        tree = tree.strip()
        m = re.match(r"^([\w:\s]*?)::\s*\{(.*)\}$", tree, re.S) or re.match(r"^()\{(.*)\}$", tree, re.S)
        if m:
            head = (prefix + "::" + m.group(1).strip()).strip(":")
            depth, part = 0, ""
            for ch in m.group(2) + ",":
                if ch == "{":
                    depth += 1
                elif ch == "}":
                    depth -= 1
                if ch == "," and not depth:
                    if part.strip():
                        expand(head, part, pos, public)
                    part = ""
                else:
                    part += ch
            return
        tree = re.sub(r"\s+as\s+\w+$", "", tree)
        paths.append(((prefix + "::" + tree).strip(":").replace(" ", ""), pos, public))

    for m in USE.finditer(code):
        public = bool(re.search(r"\bpub(\([^)]*\))?\s*$", code[max(0, m.start() - 20):m.start()]))
        expand("", m.group(1), m.start(), public)
    code_wo_use = USE.sub(lambda m: " " * len(m.group(0)), code)
    code_wo_use = re.sub(r"\bin\s+(super|self|crate)[\w:]*", lambda m: " " * len(m.group(0)), code_wo_use)
    for m in PATH.finditer(code_wo_use):
        paths.append((re.sub(r"\s", "", m.group(1)), m.start(), False))
    return paths


INLINE_MOD = re.compile(r"\bmod\s+(\w+)\s*\{")


def inline_depth(code: str) -> list[tuple[int, int]]:
    """The spans of a file's inline `mod x { ... }` blocks."""
    spans = []
    for m in INLINE_MOD.finditer(code):
        spans.append((m.start(), closing_brace(code, m.end() - 1)))
    return spans


DEF = re.compile(
    r"\b(?:fn|struct|enum|trait|type|const|static|union|mod)\s+(\w+)|\bmacro_rules!\s*(\w+)"
)


def use_map(code: str) -> tuple[dict[str, tuple[str, int]], list[tuple[str, int]]]:
    """A file's imports: the local name of each `use` (renames included) to
    its path and position, and the paths and positions of its globs."""
    names, globs = {}, []
    for m in USE.finditer(code):
        for p, _, _ in use_paths("use " + m.group(1) + ";"):
            if p.endswith("::*"):
                globs.append((p[:-3], m.start()))
            else:
                parts = p.split("::")
                if parts[-1] == "self":
                    parts.pop()
                names[parts[-1]] = ("::".join(parts), m.start())
        for rename in re.finditer(r"([\w:]+)\s+as\s+(\w+)", m.group(1)):
            names[rename.group(2)] = (rename.group(1), m.start())
    return names, globs


EXPORTED_MACRO = re.compile(r"#\[macro_export\][\s\S]{0,200}?macro_rules!\s*(\w+)")
HEAD = re.compile(r"(?<![\w:.$])([A-Za-z_]\w*)\s*::\s*(?=\w)")
IDENT = re.compile(r"(?<![\w:.$'])([A-Za-z_]\w*)\b(?!\s*::)")


class Crates:
    """What each file defines and imports, and how a path resolves to the
    file that defines its item."""

    def __init__(self, mods: dict[str, Path]):
        self.mods = mods
        self.info = {}
        self.exported = {}
        for mod, path in mods.items():
            code = strip(path.read_text())
            defs = {a or b for a, b in DEF.findall(code)}
            names, globs = use_map(code)
            spans = inline_depth(code)
            self.info[mod] = (code, defs, names, globs, spans)
            for m in EXPORTED_MACRO.finditer(code):
                self.exported[(mod.split("::")[0], m.group(1))] = mod

    def absolute(self, parts: list[str], mod: str, pos: int = -1) -> list[str]:
        """`parts` as written at `pos` of `mod`'s file, from the crate root:
        inside an inline module (`mod tests { .. }`) its `super`s and `self`
        stay in the file."""
        here = mod.split("::")
        if parts[0] == "crate":
            return [here[0]] + parts[1:]
        spans = self.info[mod][4]
        inner = sum(1 for a, b in spans if a < pos < b)
        target = list(here)
        while parts and parts[0] in ("super", "self"):
            if parts[0] == "super":
                if inner:
                    inner -= 1
                else:
                    target.pop()
            parts = parts[1:]
        return target + parts

    def resolve(self, parts: list[str], depth: int = 0) -> str | None:
        """The file defining the item `parts` (from the crate root) names."""
        if depth > 20 or not parts or parts[0] not in self.info:
            return None
        cur = parts[0]
        for i, seg in enumerate(parts[1:], 1):
            if cur + "::" + seg in self.info:
                cur = cur + "::" + seg
                continue
            _, defs, names, globs, _ = self.info[cur]
            if seg in defs:
                return cur
            if (parts[0], seg) in self.exported and cur == parts[0]:
                return self.exported[(parts[0], seg)]
            if seg in names:
                target, pos = names[seg]
                target = target.split("::")
                if target[0] not in ("crate", "super", "self"):
                    if cur + "::" + target[0] not in self.info and target[0] not in defs:
                        return None
                    target = ["self"] + target
                return self.resolve(self.absolute(target, cur, pos) + parts[i + 1:], depth + 1) or cur
            for g, pos in globs:
                got = self.resolve(self.absolute(g.split("::"), cur, pos) + [seg] + parts[i + 1:], depth + 1)
                if got:
                    return got
            return cur
        return cur

    def glob_bases(self, mod: str) -> list[list[str]]:
        """The crate modules a file glob-imports (but itself)."""
        out = []
        for g, pos in self.info[mod][3]:
            parts = g.split("::")
            if parts[0] in ("crate", "super", "self"):
                base = self.absolute(parts, mod, pos)
                if "::".join(base) != mod:
                    out.append(base)
        return out

    def named(self, mod: str) -> list[tuple[list[str], int]]:
        """Every path a file names, from the crate root, with its position:
        `use` paths and paths in code (`crate::`, `super::`, `self::`, a
        child module, a name a glob import brings), and bare names a glob
        import brings. `pub use` re-exports are left out: they are followed
        where an item is looked up, and are no dependency themselves."""
        code, defs, names, _, _ = self.info[mod]
        children = {m.rsplit("::", 1)[1] for m in self.mods if m.rsplit("::", 1)[0] == mod and "::" in m}
        bases = self.glob_bases(mod)
        out = []
        for p, pos, public in use_paths(code):
            parts = p.split("::")
            if parts[-1] in ("*", "self"):
                parts = parts[:-1]
            if public or not parts:
                continue
            if parts[0] in children:
                parts = ["self"] + parts
            if parts[0] in ("crate", "super", "self"):
                out.append((self.absolute(parts, mod, pos), pos))
        body = USE.sub(lambda m: " " * len(m.group(0)), code)
        for m in HEAD.finditer(body):
            head = m.group(1)
            if head in ("crate", "super", "self", "Self"):
                continue
            rest = re.match(r"[\w\s:]*", body[m.end():]).group(0)
            tail = [head] + [x for x in re.sub(r"\s", "", rest).split("::") if x]
            if head in children:
                out.append((self.absolute(["self"] + tail, mod, m.start()), m.start()))
                continue
            if head in names or head in defs:
                continue
            for base in bases:
                _, bdefs, bnames, _, _ = self.info.get("::".join(base), (None, set(), {}, [], []))
                if "::".join(base + [head]) in self.info or head in bdefs or head in bnames:
                    out.append((base + tail, m.start()))
        if bases:
            for m in IDENT.finditer(body):
                ident = m.group(1)
                if ident in defs or ident in names:
                    continue
                for base in bases:
                    _, bdefs, bnames, _, _ = self.info.get("::".join(base), (None, set(), {}, [], []))
                    if ident in bdefs or ident in bnames:
                        out.append((base + [ident], m.start()))
        return out


def dependencies(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Each file's dependencies: the files that define what it names, found
    through re-exports and imports to where each item is defined."""
    crates = Crates(mods)
    deps: dict[str, set[str]] = {m: set() for m in mods}
    for mod in mods:
        for parts, _ in crates.named(mod):
            got = crates.resolve(parts)
            if got and got != mod:
                deps[mod].add(got)
    return deps


def cycles(deps: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one file (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(deps[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(deps):
        if v not in index:
            visit(v)
    return out


def part_dependencies(deps: dict[str, set[str]]) -> dict[str, set[str]]:
    """The dependencies between the parts of each module (the files and
    folders directly inside it): a file's dependency on another, seen from
    their closest common module, is one of the part holding the first on
    the part holding the second. A module and its own descendants are one
    part (a child names its parent's items, a parent its children's)."""
    parts: dict[str, set[str]] = {}
    for a, targets in deps.items():
        for b in targets:
            pa, pb = a.split("::"), b.split("::")
            k = 0
            while k < min(len(pa), len(pb)) and pa[k] == pb[k]:
                k += 1
            if k == len(pa) or k == len(pb):
                continue
            x, y = "::".join(pa[: k + 1]), "::".join(pb[: k + 1])
            parts.setdefault(x, set()).add(y)
            parts.setdefault(y, set())
    return parts


def main() -> int:
    mods = files()
    report = "--report" in sys.argv
    bad = 0
    longest = []
    for mod, path in mods.items():
        for name, line, lines in long_functions(path):
            longest.append((lines, f"{path.relative_to(ROOT)}:{line} {name}"))
    longest.sort(reverse=True)
    for lines, where in longest:
        if lines > MAX_LINES:
            bad += 1
            print(f"{where}: {lines} lines (at most {MAX_LINES})")
    if report:
        print("\nlongest:")
        for lines, where in longest[:40]:
            print(f"  {lines:4} {where}")
    deps = dependencies(mods)
    parts = part_dependencies(deps)
    for comp in cycles(parts):
        bad += 1
        inner = {m: sorted(parts[m] & set(comp)) for m in comp}
        print("import circle: " + "; ".join(f"{m} -> {', '.join(d)}" for m, d in inner.items()))
    if report:
        print("\ndependencies:")
        for m in sorted(deps):
            print(f"  {m} -> {', '.join(sorted(deps[m]))}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
