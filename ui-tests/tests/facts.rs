//! The stub generator (`dlcast-stubgen/dlcast_stubgen.py`, Python) reads the
//! framework and dtype tables (`dlcast-runtime/src/facts.rs`) through a
//! block generated from them: this test fails while that block differs from
//! what the tables give (a framework or dtype added to the tables and not to
//! the generator), and with `DLCAST_BLESS=1` rewrites it.

use dlcast_runtime::facts::{DTYPES, FRAMEWORKS};
use std::fmt::Write;
use std::path::Path;

const BEGIN: &str = "# ---- generated from dlcast-runtime/src/facts.rs; do not edit ----\n";
const END: &str = "# ---- end of generated ----\n";

/// A Python string literal of `s` (the tables hold plain ASCII names).
fn py_str(s: &str) -> String {
    assert!(s
        .chars()
        .all(|c| c.is_ascii_graphic() && c != '"' && c != '\\'));
    format!("\"{s}\"")
}

/// The block's text between its markers.
fn block() -> String {
    let mut out = String::from(
        "# `DLCAST_BLESS=1 cargo test -p dlcast-ui-tests --test facts` rewrites it;\n\
         # that test fails while it differs from the tables.\n\
         # Each framework's array type as a signature line names it: its type in the\n\
         # stub, the modules the stub imports for it, whether those ship types,\n\
         # whether `like(x)` recognises its arrays (returns in that framework).\n\
         FRAMEWORK_TYPES: dict[str, tuple[str, tuple[str, ...], bool, bool]] = {\n",
    );
    for f in FRAMEWORKS {
        let modules: Vec<String> = f.stub.imports.iter().map(|m| py_str(m)).collect();
        let modules = match modules.len() {
            0 => "()".to_string(),
            1 => format!("({},)", modules[0]),
            _ => format!("({})", modules.join(", ")),
        };
        let typed = if f.stub.typed { "True" } else { "False" };
        let like = if f.modules.is_empty() {
            "False"
        } else {
            "True"
        };
        writeln!(
            out,
            "    {}: ({}, {modules}, {typed}, {like}),",
            py_str(f.python_type),
            py_str(f.stub.ty)
        )
        .unwrap();
    }
    out.push_str(
        "}\n# The dtypes NumPy has scalar types for (`numpy.float32`, ...).\n\
         NUMPY_DTYPES: set[str] = {\n",
    );
    let names: Vec<String> = DTYPES
        .iter()
        .filter(|d| !d.numpy.is_empty())
        .map(|d| py_str(d.name))
        .collect();
    let mut line = String::from("   ");
    for name in names {
        if line.len() + name.len() + 2 > 88 {
            writeln!(out, "{line}").unwrap();
            line = String::from("   ");
        }
        write!(line, " {name},").unwrap();
    }
    writeln!(out, "{line}\n}}").unwrap();
    out
}

#[test]
fn stub_generator_reads_the_tables() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../dlcast-stubgen/dlcast_stubgen.py");
    let text = std::fs::read_to_string(&path).expect("dlcast-stubgen/dlcast_stubgen.py");
    let start = text.find(BEGIN).expect("the generated block's first line") + BEGIN.len();
    let len = text[start..]
        .find(END)
        .expect("the generated block's last line");
    let expected = block();
    if text[start..start + len] == expected {
        return;
    }
    if std::env::var_os("DLCAST_BLESS").is_some_and(|v| v == "1") {
        let new = format!("{}{expected}{}", &text[..start], &text[start + len..]);
        std::fs::write(&path, new).expect("rewrite the stub generator");
        return;
    }
    panic!(
        "dlcast-stubgen/dlcast_stubgen.py's generated block differs from dlcast-runtime/src/facts.rs; \
         run `DLCAST_BLESS=1 cargo test -p dlcast-ui-tests --test facts`. Expected:\n{expected}"
    );
}
