//! The Python-facing signature of a `#[dlpack_fn]` function, written as the
//! first line of its docstring (as pybind11 and nanobind do) with each array
//! parameter's constraints as `ndarray[float32, (n, 3), cpu]`.
//!
//! The annotation grammar (valid Python expressions, so that `inspect` and
//! the stub generator can parse them):
//! `ndarray[<dtype>, <shape>, <order>, <device>, writable]`, where every part
//! but the device is left out when unconstrained; `<dtype>` is a NumPy name
//! or `float32 | float64` for a dtype-generic parameter; `<shape>` is a
//! Python tuple of integers, names, `_` and `...`; `<order>` is
//! `c_contiguous`, `f_contiguous` or `contiguous`; `<device>` is `cpu`,
//! `cuda(0)`, ... joined with `|`.

use crate::annot::{Annotations, Dim, Order};
use crate::facts::DTYPES;
use proc_macro2::{Delimiter, TokenStream, TokenTree};
use syn::{Attribute, GenericArgument, PathArguments, ReturnType, Type};

/// The NumPy name of an element type spelled in Rust, if dlcast knows it:
/// the row of the dtype table whose `#[dtype]` name (`f16`), type (`Complex<f32>`,
/// however its path is spelled) or other name (`Complex32`) it is.
pub fn element_name(ty: &Type) -> Option<&'static str> {
    DTYPES
        .iter()
        .find(|d| {
            let row: Type = syn::parse_str(d.ty).expect("the dtype table's types parse");
            same_type(ty, &row)
                || last_ident_is(ty, d.rust)
                || d.aka.iter().any(|aka| last_ident_is(ty, aka))
        })
        .map(|d| d.name)
}

/// The type as a path, through the invisible groups of macro expansion.
fn as_path(ty: &Type) -> Option<&syn::Path> {
    match ty {
        Type::Group(g) => as_path(&g.elem),
        Type::Path(p) if p.qself.is_none() => Some(&p.path),
        _ => None,
    }
}

/// Whether `ty` is a path without generic arguments ending in `name`.
fn last_ident_is(ty: &Type, name: &str) -> bool {
    as_path(ty)
        .and_then(|p| p.segments.last())
        .is_some_and(|s| s.arguments.is_none() && s.ident == name)
}

/// Whether two types name the same type as far as their last segments and
/// their generic arguments tell (`Complex<f32>` and `num_complex::Complex<f32>`).
fn same_type(a: &Type, b: &Type) -> bool {
    let (Some(a), Some(b)) = (as_path(a), as_path(b)) else {
        return false;
    };
    let (Some(a), Some(b)) = (a.segments.last(), b.segments.last()) else {
        return false;
    };
    if a.ident != b.ident {
        return false;
    }
    match (&a.arguments, &b.arguments) {
        (PathArguments::None, PathArguments::None) => true,
        (PathArguments::AngleBracketed(x), PathArguments::AngleBracketed(y)) => {
            x.args.len() == y.args.len()
                && x.args.iter().zip(&y.args).all(|pair| match pair {
                    (GenericArgument::Type(x), GenericArgument::Type(y)) => {
                        same_type(x, y)
                            || element_name(x).is_some_and(|n| Some(n) == element_name(y))
                    }
                    _ => false,
                })
        }
        _ => false,
    }
}

/// The array annotation of one parameter; `dtype` is its dtype text
/// (`None` for the untyped views).
/// `shape` is the shape the call checks: `#[shape(..)]` with the rank the
/// parameter's type fixes written in (`ArrayView2` shows as `(_, _)`).
pub fn array_annotation(
    annots: &Annotations,
    shape: Option<&[Dim]>,
    dtype: Option<String>,
    names: &[String],
    writable: bool,
    optional: bool,
) -> String {
    let mut parts: Vec<String> = Vec::new();
    parts.extend(dtype);
    if let Some(dims) = shape {
        let items: Vec<String> = dims
            .iter()
            .map(|d| match d {
                Dim::Fixed(n) => n.to_string(),
                Dim::Any => "_".into(),
                Dim::Rest => "...".into(),
                Dim::Named(id) => {
                    let s = id.to_string();
                    debug_assert!(names.contains(&s));
                    s
                }
            })
            .collect();
        parts.push(if items.len() == 1 {
            format!("({},)", items[0])
        } else {
            format!("({})", items.join(", "))
        });
    }
    match annots.order {
        Some(Order::C) => parts.push("c_contiguous".into()),
        Some(Order::F) => parts.push("f_contiguous".into()),
        Some(Order::Contiguous) => parts.push("contiguous".into()),
        None => {}
    }
    parts.push(match &annots.devices {
        None => "cpu".into(),
        Some(list) => list
            .iter()
            .map(|d| match d.id {
                Some(id) => format!("{}({id})", d.name),
                None => d.name.clone(),
            })
            .collect::<Vec<_>>()
            .join(" | "),
    });
    if writable {
        parts.push("writable".into());
    }
    let ann = format!("ndarray[{}]", parts.join(", "));
    if optional {
        format!("{ann} | None")
    } else {
        ann
    }
}

fn last_ident(ty: &Type) -> Option<(String, &PathArguments)> {
    match ty {
        Type::Path(p) => p
            .path
            .segments
            .last()
            .map(|s| (s.ident.to_string(), &s.arguments)),
        Type::Reference(r) => last_ident(&r.elem),
        Type::Group(g) => last_ident(&g.elem),
        _ => None,
    }
}

fn first_type_arg(args: &PathArguments) -> Option<&Type> {
    let PathArguments::AngleBracketed(a) = args else {
        return None;
    };
    a.args.iter().find_map(|g| match g {
        GenericArgument::Type(t) => Some(t),
        _ => None,
    })
}

/// The Python annotation of a plain (non-array) parameter or return type,
/// where the Rust type says it: numbers, `bool`, strings, `Option`, `Vec`,
/// arrays and tuples of those, PyO3's object types. `array` names the
/// Python type of returned arrays, `self_name` the class `Self` means.
pub fn python_type(ty: &Type, array: &str, self_name: Option<&str>) -> Option<String> {
    let rec = |t: &Type| python_type(t, array, self_name);
    if let Type::Tuple(t) = ty {
        if t.elems.is_empty() {
            return Some("None".into());
        }
        let items: Option<Vec<String>> = t.elems.iter().map(&rec).collect();
        return Some(format!("tuple[{}]", items?.join(", ")));
    }
    if let Type::Array(a) = ty {
        return Some(format!("list[{}]", rec(&a.elem)?));
    }
    if let Type::Slice(a) = ty {
        return Some(format!("list[{}]", rec(&a.elem)?));
    }
    let (id, args) = last_ident(ty)?;
    Some(match id.as_str() {
        "f32" | "f64" => "float".into(),
        "i8" | "i16" | "i32" | "i64" | "isize" | "u8" | "u16" | "u32" | "u64" | "usize" => {
            "int".into()
        }
        "bool" => "bool".into(),
        "str" | "String" => "str".into(),
        "Option" => format!("{} | None", rec(first_type_arg(args)?)?),
        "Vec" => format!("list[{}]", rec(first_type_arg(args)?)?),
        "PyResult" | "Result" => rec(first_type_arg(args)?)?,
        // The dtype and rank, where the Rust type fixes them:
        // `numpy.ndarray[float32, (_, _)]`, `like(x)[float32]`.
        "Tensor" | "TensorRef" | "TensorMut" if array != "..." => {
            let mut parts: Vec<String> = Vec::new();
            parts.extend(
                first_type_arg(args)
                    .and_then(element_name)
                    .map(String::from),
            );
            if let Some(n) = const_rank(args) {
                parts.push(match n {
                    0 => "()".into(),
                    1 => "(_,)".into(),
                    n => format!("({})", vec!["_"; n].join(", ")),
                });
            }
            if parts.is_empty() {
                array.into()
            } else {
                format!("{array}[{}]", parts.join(", "))
            }
        }
        "Tensor" | "TensorRef" | "TensorMut" | "TensorDyn" | "TensorDynMut" => array.into(),
        "Bound" | "Py" | "Borrowed" | "PyRef" | "PyRefMut" => rec(first_type_arg(args)?)?,
        "PyAny" | "PyObject" => "object".into(),
        "PyType" => "type".into(),
        "PyString" => "str".into(),
        "PyBytes" => "bytes".into(),
        "PyDict" => "dict[typing.Any, typing.Any]".into(),
        "PyList" => "list[typing.Any]".into(),
        "PyTuple" => "tuple[typing.Any, ...]".into(),
        "PyFloat" => "float".into(),
        "PyInt" => "int".into(),
        "PyBool" => "bool".into(),
        "Self" => self_name?.into(),
        _ => return None,
    })
}

/// The rank a view type's const argument fixes (`TensorRef<'_, f32, 2>`);
/// `None` for the dynamic rank (the default) or an expression.
fn const_rank(args: &PathArguments) -> Option<usize> {
    let PathArguments::AngleBracketed(a) = args else {
        return None;
    };
    a.args.iter().find_map(|g| match g {
        GenericArgument::Const(syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Int(n),
            ..
        })) => n.base10_parse::<usize>().ok(),
        _ => None,
    })
}

/// The Python annotation of the function's result, if the Rust type says it.
pub fn return_annotation(ret: &ReturnType, array: &str, self_name: Option<&str>) -> Option<String> {
    match ret {
        ReturnType::Default => Some("None".into()),
        ReturnType::Type(_, ty) => python_type(ty, array, self_name),
    }
}

/// What the user's `#[pyo3(..)]` / `#[pyfunction(..)]` attributes say about
/// the signature.
#[derive(Default)]
pub struct Pyo3Attrs {
    /// The parenthesised list of `signature = (..)`.
    pub signature: Option<TokenStream>,
    /// `name = ".."`: the Python name.
    pub name: Option<String>,
    /// `pass_module`: the first parameter is the module, not an argument.
    pub pass_module: bool,
}

/// Scans `#[pyo3(..)]` and `#[pyfunction(..)]` attributes for `signature`,
/// `name` and `pass_module`.
pub fn scan_pyo3_attrs(attrs: &[Attribute]) -> Pyo3Attrs {
    let mut out = Pyo3Attrs::default();
    let ours = |a: &&Attribute| {
        a.path()
            .segments
            .last()
            .is_some_and(|s| s.ident == "pyo3" || s.ident == "pyfunction")
    };
    for attr in attrs.iter().filter(ours) {
        let syn::Meta::List(list) = &attr.meta else {
            continue;
        };
        let tokens: Vec<TokenTree> = list.tokens.clone().into_iter().collect();
        for (i, t) in tokens.iter().enumerate() {
            let TokenTree::Ident(id) = t else { continue };
            let is_eq =
                |k: usize| matches!(tokens.get(k), Some(TokenTree::Punct(p)) if p.as_char() == '=');
            if id == "pass_module" {
                out.pass_module = true;
            }
            if id == "name" && is_eq(i + 1) {
                if let Some(TokenTree::Literal(l)) = tokens.get(i + 2) {
                    if let Ok(s) = syn::parse_str::<syn::LitStr>(&l.to_string()) {
                        out.name = Some(s.value());
                    }
                }
            }
            if id == "signature" && is_eq(i + 1) {
                if let Some(TokenTree::Group(g)) = tokens.get(i + 2) {
                    if g.delimiter() == Delimiter::Parenthesis {
                        out.signature = Some(g.stream());
                    }
                }
            }
        }
    }
    out
}

/// A default value as Python would spell it; `...` where the Rust
/// expression is not a plain literal.
fn python_default(tokens: &[TokenTree]) -> String {
    let text: Vec<String> = tokens.iter().map(|t| t.to_string()).collect();
    match text.join("").as_str() {
        "None" => "None".into(),
        "true" => "True".into(),
        "false" => "False".into(),
        s if tokens.iter().all(|t| match t {
            TokenTree::Literal(_) => true,
            TokenTree::Punct(p) => p.as_char() == '-',
            _ => false,
        }) && !s.is_empty() =>
        {
            s.to_string()
        }
        _ => "...".into(),
    }
}

/// Writes the parameter list of the signature line: `params` are the
/// Python-visible parameters in Rust order with their annotations;
/// `signature` is the user's `#[pyo3(signature = (..))]`, which decides
/// order, defaults, `/`, `*`, `*args` and `**kwargs` when given.
pub fn parameter_list(
    params: &[(String, Option<String>)],
    signature: Option<&TokenStream>,
) -> String {
    let annotated = |name: &str| -> String {
        match params.iter().find(|(n, _)| n == name) {
            Some((_, Some(a))) => format!("{name}: {a}"),
            _ => name.to_string(),
        }
    };
    let Some(sig) = signature else {
        return params
            .iter()
            .map(|(n, _)| annotated(n))
            .collect::<Vec<_>>()
            .join(", ");
    };
    let tokens: Vec<TokenTree> = sig.clone().into_iter().collect();
    let mut items = Vec::new();
    for chunk in tokens.split(|t| matches!(t, TokenTree::Punct(p) if p.as_char() == ',')) {
        let stars = chunk
            .iter()
            .take_while(|t| matches!(t, TokenTree::Punct(p) if p.as_char() == '*'))
            .count();
        let rest = &chunk[stars..];
        let item = match rest {
            [] if stars == 0 => continue,
            [] => "*".to_string(),
            [TokenTree::Punct(p)] if p.as_char() == '/' => "/".to_string(),
            [TokenTree::Ident(id)] if stars > 0 => format!("{}{id}", "*".repeat(stars)),
            [TokenTree::Ident(id)] => annotated(&id.to_string()),
            [TokenTree::Ident(id), TokenTree::Punct(eq), default @ ..] if eq.as_char() == '=' => {
                format!(
                    "{} = {}",
                    annotated(&id.to_string()),
                    python_default(default)
                )
            }
            other => other.iter().map(|t| t.to_string()).collect::<String>(),
        };
        items.push(item);
    }
    items.join(", ")
}

/// The parameter list with the receiver (`self`, `cls`) in front.
pub fn with_receiver(receiver: &str, params_text: &str) -> String {
    match (receiver.is_empty(), params_text.is_empty()) {
        (true, _) => params_text.to_string(),
        (false, true) => receiver.to_string(),
        (false, false) => format!("{receiver}, {params_text}"),
    }
}

/// The signature line `__init__(self, ..) -> None` of a `#[new]` method,
/// from its parameter list (without receiver). PyO3 shows no docstring of
/// `#[new]`, so the line is kept in a class attribute, `__dlcast_new__`,
/// which the stub generator reads.
pub fn init_line(params_text: &str) -> String {
    format!("__init__({}) -> None", with_receiver("self", params_text))
}

/// The class attribute `__dlcast_<name>__` of a special method `__<name>__`
/// and its text: the signature line (without its leading space), then the
/// doc comment. Python gives a special method (a slot) a docstring of its
/// own; the stub generator reads this one instead.
pub fn special_attr(name: &str, line: &str, attrs: &[Attribute]) -> (String, String) {
    let bare = name.trim_start_matches('_').trim_end_matches('_');
    let mut text = line.trim_start().to_string();
    let doc: Vec<String> = attrs
        .iter()
        .filter(|a| a.path().is_ident("doc"))
        .filter_map(|a| match &a.meta {
            syn::Meta::NameValue(nv) => match &nv.value {
                syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(s),
                    ..
                }) => Some(s.value()),
                _ => None,
            },
            _ => None,
        })
        .collect();
    if !doc.is_empty() {
        // Doc comments keep the space after `///`.
        let body: Vec<&str> = doc
            .iter()
            .map(|l| l.strip_prefix(' ').unwrap_or(l))
            .collect();
        text = format!("{text}\n\n{}", body.join("\n"));
    }
    (format!("__dlcast_{bare}__"), text)
}

#[cfg(test)]
mod element_name_tests {
    use super::element_name;
    use crate::facts::DTYPES;
    use syn::Type;

    fn name_of(ty: &str) -> Option<&'static str> {
        element_name(&syn::parse_str::<Type>(ty).unwrap())
    }

    #[test]
    fn every_row_is_recognised_as_its_type_and_names() {
        for d in DTYPES {
            assert_eq!(name_of(d.ty), Some(d.name), "{}", d.ty);
            assert_eq!(name_of(d.rust), Some(d.name), "{}", d.rust);
            for aka in d.aka {
                assert_eq!(name_of(aka), Some(d.name), "{aka}");
            }
            // However the type's path is spelled.
            let last = d.ty.rsplit(" :: ").next().unwrap().replace(' ', "");
            assert_eq!(name_of(&last), Some(d.name), "{last}");
        }
    }

    #[test]
    fn other_types_are_not_elements() {
        for ty in [
            "String",
            "Complex<u8>",
            "Complex<f32, f32>",
            "Vec<f32>",
            "&f32",
            "f24",
        ] {
            assert_eq!(name_of(ty), None, "{ty}");
        }
        assert_eq!(name_of("num_complex::Complex64"), Some("complex128"));
        assert_eq!(name_of("Complex<half::f16>"), None);
    }
}
