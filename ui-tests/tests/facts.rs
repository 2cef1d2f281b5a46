//! Every copy of the framework and dtype tables' facts
//! (`dlcast-runtime/src/facts.rs`: `FRAMEWORKS`, `DTYPES`) outside the
//! tables is generated from them here ([`GENERATED`]), so that a row added
//! to a table needs no other hand edit of these copies: the stub
//! generator's block (`dlcast-stubgen/dlcast_stubgen.py`), the Python
//! tests' copy of the tables (`tests/python/facts_table.py`, from which
//! their lists of frameworks and dtypes come), the option lists of the ui
//! snapshots (`ui-tests/tests/ui/fail/*.stderr`, the macro's messages) and
//! of the macro's docs, the guide's `returns` table, stub types and
//! `#[dtype]` names, and the README's producers. A test fails while one
//! differs from what the tables give, naming the file;
//! `DLCAST_BLESS=1 cargo test -p dlcast-ui-tests --test facts` rewrites
//! them all.
//!
//! Each copy is a function of the tables, and `each_check_bites` renders
//! it with one made-up row added to each table (a framework `dpnp`, a dtype
//! `complex32`) and asserts the copy then differs.

use dlcast_runtime::facts::{
    code, DTypeFacts, FrameworkFacts, Handover, ReadOnly, Stub, DTYPES, FRAMEWORKS,
};
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The command that regenerates every generated copy.
const BLESS: &str = "DLCAST_BLESS=1 cargo test -p dlcast-ui-tests --test facts";

/// Held by each test while it reads or writes the copies (the tests run
/// in parallel, and one of them rewrites files under `DLCAST_BLESS=1`).
static FILES: Mutex<()> = Mutex::new(());

/// The two tables, or the same with a made-up row each (`each_check_bites`).
struct Tables<'a> {
    frameworks: &'a [FrameworkFacts],
    dtypes: &'a [DTypeFacts],
}

const REAL: Tables<'static> = Tables {
    frameworks: FRAMEWORKS,
    dtypes: DTYPES,
};

/// A copy generated from the tables: the text between `begin` and the
/// first `end` after it (both kept) is `render`'s.
struct Generated {
    file: &'static str,
    begin: &'static str,
    end: &'static str,
    render: fn(&Tables) -> String,
}

const GENERATED: &[Generated] = &[
    Generated {
        file: "dlcast-stubgen/dlcast_stubgen.py",
        begin: "# ---- generated from dlcast-runtime/src/facts.rs; do not edit ----\n",
        end: "# ---- end of generated ----\n",
        render: stub_block,
    },
    Generated {
        file: "tests/python/facts_table.py",
        begin: "# ---- generated from dlcast-runtime/src/facts.rs; do not edit ----\n",
        end: "# ---- end of generated ----\n",
        render: python_tables,
    },
    Generated {
        file: "ui-tests/tests/ui/fail/returns_unknown.stderr",
        begin: "unknown framework `mxnet`; expected one of: ",
        end: "\n",
        render: option_message,
    },
    Generated {
        file: "ui-tests/tests/ui/fail/dlcast_pyfunction_options.stderr",
        begin: "unknown framework `nump`; expected one of: ",
        end: "\n",
        render: option_message,
    },
    Generated {
        file: "ui-tests/tests/ui/fail/unknown_dtype.stderr",
        begin: "unknown dtype `float128`; expected one of: ",
        end: "\n",
        render: dtype_message,
    },
    Generated {
        file: "guide/src/annotations.md",
        begin: "`#[dtype]` names (the dtype table's `rust` column):\n",
        end: ".\n",
        render: dtype_names,
    },
    Generated {
        file: "dlcast-macros/src/lib.rs",
        begin: "where `<framework>` is\n/// ",
        end: "\n/// (the framework table of",
        render: options_in_prose,
    },
    Generated {
        file: "guide/src/returning-arrays.md",
        begin: "`numpy.asarray` take it |\n",
        end: "| `returns = like(param)` |",
        render: returns_rows,
    },
    Generated {
        file: "guide/src/types-and-stubs.md",
        begin: "the array type of the framework they go\nto —\n",
        end: "\n(the framework table's stub column",
        render: stub_types,
    },
    Generated {
        file: "README.md",
        begin: "from **any DLPack producer** — ",
        end: ", raw DLPack capsules",
        render: producer_names,
    },
];

/// `render` of the copies the macro's messages make: `, `-joined.
fn option_message(t: &Tables) -> String {
    let options: Vec<&str> = t.frameworks.iter().map(|f| f.option).collect();
    format!("{}, dlcast, or like(<parameter>)", options.join(", "))
}

fn dtype_message(t: &Tables) -> String {
    let names: Vec<&str> = t.dtypes.iter().map(|d| d.rust).collect();
    names.join(", ")
}

/// The guide's sentence of `#[dtype]` names (one line: Markdown joins it).
fn dtype_names(t: &Tables) -> String {
    let names: Vec<String> = t.dtypes.iter().map(|d| format!("`{}`", d.rust)).collect();
    let (last, rest) = names.split_last().expect("a dtype table with rows");
    format!("{}, and {last}", rest.join(", "))
}

/// The macro docs' options, as a sentence lists them (one line, which
/// rustfmt leaves as it is).
fn options_in_prose(t: &Tables) -> String {
    let options: Vec<String> = t
        .frameworks
        .iter()
        .map(|f| format!("`{}`", f.option))
        .collect();
    let (last, rest) = options.split_last().expect("a framework table with rows");
    format!("{} or {last}", rest.join(", "))
}

/// The guide's `returns` table, a row per framework: its array type, the
/// function that takes the array, and how (the `handover` column), what
/// becomes of read-only data (`read_only`) and whether it takes host
/// memory only (`host_only`).
fn returns_rows(t: &Tables) -> String {
    let mut out = String::new();
    for f in t.frameworks {
        let (module, func) = f.handover.importer();
        let via = format!("`{module}.{func}`");
        let how = match f.handover {
            Handover::FromDlpack { .. } => format!("via {via}"),
            Handover::LegacyCapsule { .. } => {
                format!("via {via}, which takes a legacy DLPack capsule")
            }
            Handover::NumpyCApi { .. } => {
                format!("made through NumPy's C API (via {via} where that cannot be used)")
            }
            Handover::TorchExchange { .. } => format!(
                "through PyTorch's DLPack exchange table for host memory (via {via} otherwise)"
            ),
            Handover::Buffer { .. } => format!("via {via}, over the buffer protocol"),
        };
        let read_only = match f.read_only {
            ReadOnly::Marked => "read-only data stays read-only",
            ReadOnly::Immutable => "read-only data goes as a copy (immutable arrays)",
            ReadOnly::Refused => "read-only data goes as a copy (no read-only arrays)",
        };
        let host = if f.host_only {
            "; host memory only"
        } else {
            ""
        };
        writeln!(
            out,
            "| `{}` | `{}` {how}; {read_only}{host} |",
            f.returns, f.python_type
        )
        .unwrap();
    }
    out
}

/// The stub types as the guide lists them: the stub column's types
/// without their type arguments (`numpy.typing.NDArray`).
fn stub_types(t: &Tables) -> String {
    let types: Vec<String> = t
        .frameworks
        .iter()
        .map(|f| format!("`{}`", f.stub.ty.split('[').next().unwrap_or(f.stub.ty)))
        .collect();
    types.join(", ")
}

/// The producers the README's first sentence names: every framework whose
/// arrays dlcast recognises (a `modules` entry), by its name in messages
/// (`_` written as `-`, as the package is spelt).
fn producer_names(t: &Tables) -> String {
    let names: Vec<String> = t
        .frameworks
        .iter()
        .filter(|f| !f.modules.is_empty())
        .map(|f| f.name.replace('_', "-"))
        .collect();
    names.join(", ")
}

/// A Python string literal of `s` (the tables hold plain ASCII names).
fn py_str(s: &str) -> String {
    assert!(s
        .chars()
        .all(|c| c.is_ascii_graphic() && c != '"' && c != '\\'));
    format!("\"{s}\"")
}

/// A Python tuple of string literals.
fn py_tuple<'a>(items: impl IntoIterator<Item = &'a str>) -> String {
    let items: Vec<String> = items.into_iter().map(py_str).collect();
    match items.len() {
        0 => "()".to_string(),
        1 => format!("({},)", items[0]),
        _ => format!("({})", items.join(", ")),
    }
}

/// The stub generator's block.
fn stub_block(t: &Tables) -> String {
    let mut out = String::from(
        "# `DLCAST_BLESS=1 cargo test -p dlcast-ui-tests --test facts` rewrites it;\n\
         # that test fails while it differs from the tables.\n\
         # Each framework's array type as a signature line names it: its type in the\n\
         # stub, the modules the stub imports for it, whether those ship types,\n\
         # whether `like(x)` recognises its arrays (returns in that framework).\n\
         FRAMEWORK_TYPES: dict[str, tuple[str, tuple[str, ...], bool, bool]] = {\n",
    );
    for f in t.frameworks {
        let modules = py_tuple(f.stub.imports.iter().copied());
        let typed = py_bool(f.stub.typed);
        let like = py_bool(!f.modules.is_empty());
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
    let names: Vec<String> = t
        .dtypes
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

fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

/// The Python tests' copy of the tables: what their lists are derived from
/// or checked against.
fn python_tables(t: &Tables) -> String {
    let mut out = String::from(
        "# One tuple per row: (option, name, modules, (hand-off module, function),\n\
         # legacy_writable, python_type, layout, stub type).\n\
         FRAMEWORKS = [\n",
    );
    for f in t.frameworks {
        let (module, func) = f.handover.importer();
        writeln!(
            out,
            "    ({}, {}, {}, ({}, {}), {}, {}, {}, {}),",
            py_str(f.option),
            py_str(f.name),
            py_tuple(f.modules.iter().copied()),
            py_str(module),
            py_str(func),
            py_bool(f.legacy_writable),
            py_str(f.python_type),
            py_str(&format!("{:?}", f.layout)),
            py_str(f.stub.ty),
        )
        .unwrap();
    }
    out.push_str(
        "]\n# One tuple per row: (name, #[dtype] name, whether NumPy has it, the\n\
         # options of the frameworks without it, DLPack code, bits, kind, Rust type).\n\
         DTYPES = [\n",
    );
    for d in t.dtypes {
        let absent = d
            .absent_from
            .iter()
            .map(|a| t.frameworks[*a as usize].option);
        writeln!(
            out,
            "    ({}, {}, {}, {}, {}, {}, {}, {}),",
            py_str(d.name),
            py_str(d.rust),
            py_bool(!d.numpy.is_empty()),
            py_tuple(absent),
            d.code,
            d.bits,
            py_str(&format!("{:?}", d.kind)),
            // `stringify!` spaces out the type's tokens.
            py_str(&d.ty.split_whitespace().collect::<String>()),
        )
        .unwrap();
    }
    out.push_str("]\n");
    out
}

fn path(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(file)
}

fn read(file: &str) -> String {
    std::fs::read_to_string(path(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// The byte range of the text between `begin` and `end` in `text`.
fn section(text: &str, file: &str, begin: &str, end: &str) -> std::ops::Range<usize> {
    let start = text
        .find(begin)
        .unwrap_or_else(|| panic!("{file}: no `{begin}` (the start of a copy of dlcast-runtime/src/facts.rs's tables; keep it, or move this check along)"))
        + begin.len();
    let len = text[start..]
        .find(end)
        .unwrap_or_else(|| panic!("{file}: no `{end}` after `{begin}`"));
    start..start + len
}

/// `text` with `g`'s section as `tables` give it, where it differs.
fn regenerated(g: &Generated, text: &str, tables: &Tables) -> Option<String> {
    let range = section(text, g.file, g.begin, g.end);
    let expected = (g.render)(tables);
    (text[range.clone()] != expected)
        .then(|| format!("{}{expected}{}", &text[..range.start], &text[range.end..]))
}

#[test]
fn generated_copies_equal_the_tables() {
    let _files = FILES.lock().unwrap_or_else(|e| e.into_inner());
    let bless = std::env::var_os("DLCAST_BLESS").is_some_and(|v| v == "1");
    let mut stale = Vec::new();
    for g in GENERATED {
        let Some(new) = regenerated(g, &read(g.file), &REAL) else {
            continue;
        };
        if bless {
            std::fs::write(path(g.file), new).unwrap_or_else(|e| panic!("{}: {e}", g.file));
        } else {
            stale.push(g.file);
        }
    }
    assert!(
        stale.is_empty(),
        "generated from dlcast-runtime/src/facts.rs, and differing from it: {stale:?}; \
         run `{BLESS}`"
    );
}

/// A framework and a dtype no table has: what adding a row looks like.
fn made_up_rows() -> (Vec<FrameworkFacts>, Vec<DTypeFacts>) {
    let mut frameworks = FRAMEWORKS.to_vec();
    frameworks.push(FrameworkFacts {
        option: "dpnp",
        returns: "returns = dpnp",
        modules: &["dpnp"],
        python_type: "dpnp.ndarray",
        name: "DPNP",
        stub: Stub {
            ty: "dpnp.ndarray",
            imports: &["dpnp"],
            typed: false,
        },
        ..FRAMEWORKS[0]
    });
    let mut dtypes = DTYPES.to_vec();
    dtypes.push(DTypeFacts {
        name: "complex32",
        rust: "c32",
        element: "::dlcast_runtime::__private::Complex32",
        code: code::COMPLEX,
        bits: 32,
        numpy: &[],
        format: None,
        typestr: None,
        ..DTYPES[DTYPES.len() - 1]
    });
    (frameworks, dtypes)
}

#[test]
fn each_check_bites() {
    let _files = FILES.lock().unwrap_or_else(|e| e.into_inner());
    let (frameworks, dtypes) = made_up_rows();
    let with_framework = Tables {
        frameworks: &frameworks,
        dtypes: DTYPES,
    };
    let with_dtype = Tables {
        frameworks: FRAMEWORKS,
        dtypes: &dtypes,
    };
    // Each copy, rendered with a made-up row, differs from the file and
    // names that row (by its option, name or #[dtype] name).
    let made_up = [
        (&with_framework, ["dpnp", "DPNP"]),
        (&with_dtype, ["complex32", "c32"]),
    ];
    for g in GENERATED {
        let text = read(g.file);
        let bites = made_up.iter().any(|(t, names)| {
            regenerated(g, &text, t).is_some_and(|new| {
                let copy = &new[section(&new, g.file, g.begin, g.end)];
                names.iter().any(|n| copy.contains(n))
            })
        });
        assert!(bites, "{}: a new row is not in its copy", g.file);
    }
}
