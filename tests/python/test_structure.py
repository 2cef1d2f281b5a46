"""scripts/structure.py, the structure rules `make lint` checks (no function
over 80 lines, no import circle between the parts of any module of the
published crates),
bites: each rule reports a made-up crate that breaks it, and the crates as
they are break neither."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("structure", ROOT / "scripts" / "structure.py")
structure = importlib.util.module_from_spec(spec)
sys.modules["structure"] = structure
spec.loader.exec_module(structure)


def write(base: Path, files: dict[str, str]) -> dict[str, Path]:
    mods = {}
    for rel, text in files.items():
        path = base / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        parts = list(Path(rel).with_suffix("").parts)
        if parts[-1] in ("mod", "lib"):
            parts.pop()
        mods["::".join(["runtime", *parts])] = path
    return mods


def test_a_function_over_80_lines_is_reported(tmp_path):
    body = "\n".join(f"    let _x{i} = {i}; // {{ not a brace" for i in range(79))
    mods = write(tmp_path, {
        "lib.rs": f'fn long() {{\n{body}\n}}\n\nfn short() -> &\'static str {{\n    "}}"\n}}\n'
    })
    found = {name: lines for name, _, lines in structure.long_functions(mods["runtime"])}
    assert found == {"long": 81, "short": 3}


def test_an_import_circle_is_reported_through_reexports(tmp_path):
    mods = write(tmp_path, {
        "lib.rs": "mod a;\nmod b;\npub use b::Thing;\n",
        "a.rs": "use crate::Thing;\npub fn f() -> Thing { Thing }\n",
        "b.rs": "pub struct Thing;\npub fn g() { super::a::f(); }\n",
        "c.rs": "use crate::a::f;\n",
    })
    deps = structure.dependencies(mods)
    assert deps["runtime::a"] == {"runtime::b"}
    assert structure.cycles(structure.part_dependencies(deps)) == [["runtime::a", "runtime::b"]]


def test_a_folder_is_one_part_and_a_parent_one_with_its_children(tmp_path):
    mods = write(tmp_path, {
        "lib.rs": "mod a;\nmod t;\n",
        "a.rs": "pub fn f() { crate::t::h::g(); }\n",
        "t/mod.rs": "pub mod h;\nmod u;\npub fn k() { h::g(); }\n",
        "t/h.rs": "pub fn g() { super::k(); }\n",
        "t/u.rs": "fn x() { crate::a::f(); }\n",
    })
    deps = structure.dependencies(mods)
    assert deps["runtime::t"] == {"runtime::t::h"}
    # t/mod.rs and t/h.rs name each other: one part, no circle; but a.rs
    # and the folder t/ do (through t/u.rs).
    assert structure.cycles(structure.part_dependencies(deps)) == [["runtime::a", "runtime::t"]]


def test_a_tests_module_inside_a_file_is_the_file(tmp_path):
    mods = write(tmp_path, {
        "lib.rs": "mod a;\nmod b;\n",
        "a.rs": "pub fn f() {}\n#[cfg(test)]\nmod tests {\n    use super::f;\n    use crate::b::g;\n}\n",
        "b.rs": "pub fn g() { crate::a::f(); }\n",
    })
    deps = structure.dependencies(mods)
    assert deps["runtime::a"] == {"runtime::b"}
    assert structure.cycles(structure.part_dependencies(deps)) == [["runtime::a", "runtime::b"]]


def test_the_crates_keep_the_rules():
    mods = structure.files()
    too_long = [
        (str(path), name, lines)
        for path in mods.values()
        for name, _, lines in structure.long_functions(path)
        if lines > structure.MAX_LINES
    ]
    assert not too_long
    assert not structure.cycles(structure.part_dependencies(structure.dependencies(mods)))


# hostile: what a refactor can hide from the rules. Each made-up crate
# breaks a rule in a way the crates could; the check must report it.


@pytest.mark.hostile
def test_hostile_a_circle_through_a_glob_import_of_the_parent_is_reported(tmp_path):
    # `use super::*` brings the parent's names (its child modules, what it
    # imports) into a file, which then names a sibling (`b::g()`) without
    # `crate::`/`super::`/`self::`: call/python_steps.rs, import/torch/phase2.rs
    # and torch/direct/learn.rs are written so.
    mods = write(tmp_path, {
        "lib.rs": "mod m;\n",
        "m/mod.rs": "mod a;\nmod b;\n",
        "m/a.rs": "use super::*;\npub fn f() { b::g(); }\n",
        "m/b.rs": "pub fn g() { super::a::f(); }\n",
    })
    deps = structure.dependencies(mods)
    assert "runtime::m::b" in deps["runtime::m::a"]
    assert structure.cycles(structure.part_dependencies(deps)) == [["runtime::m::a", "runtime::m::b"]]


@pytest.mark.hostile
def test_hostile_a_circle_through_a_name_the_parent_imports_is_reported(tmp_path):
    mods = write(tmp_path, {
        "lib.rs": "mod a;\nmod b;\nuse b::Thing;\n",
        "a.rs": "use super::*;\npub fn f() -> Thing { Thing }\n",
        "b.rs": "pub struct Thing;\npub fn g() { crate::a::f(); }\n",
    })
    deps = structure.dependencies(mods)
    assert "runtime::b" in deps["runtime::a"]
    assert structure.cycles(structure.part_dependencies(deps)) == [["runtime::a", "runtime::b"]]


@pytest.mark.hostile
def test_hostile_a_circle_through_an_exported_macro_is_reported(tmp_path):
    # `#[macro_export]` puts a macro at the crate root whatever file defines
    # it: `crate::mm!` names a.rs, not lib.rs.
    mods = write(tmp_path, {
        "lib.rs": "mod a;\nmod b;\n",
        "a.rs": "#[macro_export]\nmacro_rules! mm { () => {} }\npub fn f() { crate::b::g(); }\n",
        "b.rs": "pub fn g() { crate::mm!(); }\n",
    })
    deps = structure.dependencies(mods)
    assert structure.cycles(structure.part_dependencies(deps)) == [["runtime::a", "runtime::b"]]


@pytest.mark.hostile
def test_hostile_a_long_function_a_macro_defines_or_a_long_closure_is_reported(tmp_path):
    # `fn $name` in a `macro_rules!` body (dtype.rs' element_impls, the
    # dtype table's users) and a closure outside any `fn` (a static's
    # initialiser) are code of the crate as much as a plain function.
    body = "\n".join(f"        let _x{i} = {i};" for i in range(100))
    mods = write(tmp_path, {
        "lib.rs": "macro_rules! m { ($n:ident) => { fn $n() {\n" + body + "\n    } } }\nm!(long);\n"
        "static S: std::sync::LazyLock<u8> = std::sync::LazyLock::new(|| {\n" + body + "\n    1\n});\n",
    })
    found = structure.long_functions(mods["runtime"])
    assert len([f for f in found if f[2] > structure.MAX_LINES]) == 2, found
