//! The hints PyO3's introspection reads (the `inspect` feature): the
//! signature line's annotations — the facts `#[dlpack_fn]` writes for
//! `help()` and dlcast's stub generator — rewritten into stub types as the
//! generator does (`numpy.ndarray[float32, (_, _)]` becomes
//! `numpy.ndarray[tuple[int, int], numpy.dtype[numpy.float32]]`, a
//! framework its array type) and emitted as a `PyStaticExpr`, from which
//! `maturin generate-stubs` writes the annotation and its imports.
//!
//! What PyO3's stubs cannot say, written as `typing.Any` (dlcast's generator
//! says it): an array parameter's type (a stub of PyO3's has no `Protocol`
//! for `__dlpack__` producers; the constraint text is kept in
//! `typing.Annotated`), a `like(x)` result (no type variable) and a
//! `dlcast.Array` (no protocol for it either).

use crate::analyse::ViewParam;
use crate::facts::{DTYPES, FRAMEWORKS};
use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use syn::ext::IdentExt;
use syn::FnArg;

/// A Python expression of the signature line's grammar.
#[derive(Clone, Debug, PartialEq)]
pub enum Py {
    /// A name, dotted or not (`float`, `numpy.ndarray`, `_`).
    Name(String),
    /// An integer.
    Int(String),
    /// A string constant.
    Str(String),
    /// `...`
    Ellipsis,
    /// `value[a, b]`
    Sub(Box<Py>, Vec<Py>),
    /// `(a, b)`
    Tuple(Vec<Py>),
    /// `a | b`
    Union(Vec<Py>),
    /// `f(a)` (`like(x)`)
    Call(String, Vec<Py>),
}

#[derive(Debug, PartialEq)]
enum Tok {
    Name(String),
    Int(String),
    Ellipsis,
    P(char),
}

fn tokens(text: &str) -> Option<Vec<Tok>> {
    let mut out = Vec::new();
    let cs: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < cs.len() {
        let c = cs[i];
        if c.is_whitespace() {
            i += 1;
        } else if cs[i..].starts_with(&['.', '.', '.']) {
            out.push(Tok::Ellipsis);
            i += 3;
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < cs.len() && (cs[i].is_ascii_alphanumeric() || cs[i] == '_' || cs[i] == '.') {
                i += 1;
            }
            out.push(Tok::Name(cs[start..i].iter().collect()));
        } else if c.is_ascii_digit()
            || (c == '-' && cs.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            let start = i;
            i += 1;
            while i < cs.len() && cs[i].is_ascii_digit() {
                i += 1;
            }
            out.push(Tok::Int(cs[start..i].iter().collect()));
        } else if "[](),|".contains(c) {
            out.push(Tok::P(c));
            i += 1;
        } else {
            return None;
        }
    }
    Some(out)
}

struct Parser {
    toks: Vec<Tok>,
    at: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.at)
    }
    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(&Tok::P(c)) {
            self.at += 1;
            true
        } else {
            false
        }
    }
    fn expr(&mut self) -> Option<Py> {
        let mut items = vec![self.term()?];
        while self.eat('|') {
            items.push(self.term()?);
        }
        Some(if items.len() == 1 {
            items.pop()?
        } else {
            Py::Union(items)
        })
    }
    /// `a, b, ...` up to `close` (consumed); a trailing comma allowed.
    fn list(&mut self, close: char) -> Option<(Vec<Py>, bool)> {
        let mut items = Vec::new();
        let mut comma = false;
        while !self.eat(close) {
            items.push(self.expr()?);
            comma = self.eat(',');
            if !comma {
                if !self.eat(close) {
                    return None;
                }
                break;
            }
        }
        Some((items, comma))
    }
    fn term(&mut self) -> Option<Py> {
        let tok = self.toks.get(self.at)?;
        self.at += 1;
        let mut e = match tok {
            Tok::Name(n) => Py::Name(n.clone()),
            Tok::Int(n) => Py::Int(n.clone()),
            Tok::Ellipsis => Py::Ellipsis,
            Tok::P('(') => {
                let (items, comma) = self.list(')')?;
                if items.len() == 1 && !comma {
                    items.into_iter().next()?
                } else {
                    Py::Tuple(items)
                }
            }
            Tok::P(_) => return None,
        };
        loop {
            if self.eat('[') {
                let (items, _) = self.list(']')?;
                e = Py::Sub(Box::new(e), items);
            } else if self.eat('(') {
                let Py::Name(f) = e else { return None };
                let (items, _) = self.list(')')?;
                e = Py::Call(f, items);
            } else {
                return Some(e);
            }
        }
    }
}

/// Parses an annotation of the signature line.
pub fn parse(text: &str) -> Option<Py> {
    let mut p = Parser {
        toks: tokens(text)?,
        at: 0,
    };
    let e = p.expr()?;
    (p.at == p.toks.len()).then_some(e)
}

fn any() -> Py {
    Py::Name("typing.Any".into())
}

/// NumPy's array type for `numpy.ndarray[<dtype>, <shape>]`.
fn numpy_type(parts: &[Py]) -> Py {
    let mut dtype = any();
    let mut rank = None;
    for part in parts {
        match part {
            Py::Name(n) => match DTYPES.iter().find(|d| d.name == n) {
                Some(d) if !d.numpy.is_empty() => dtype = Py::Name(format!("numpy.{n}")),
                _ => return Py::Name("numpy.typing.NDArray".into()).sub(vec![any()]),
            },
            Py::Tuple(dims) if !dims.contains(&Py::Ellipsis) => rank = Some(dims.len()),
            _ => {}
        }
    }
    match rank {
        None => Py::Name("numpy.typing.NDArray".into()).sub(vec![dtype]),
        Some(n) => {
            let shape = if n == 0 {
                vec![Py::Tuple(Vec::new())]
            } else {
                vec![Py::Name("int".into()); n]
            };
            Py::Name("numpy.ndarray".into()).sub(vec![
                Py::Name("tuple".into()).sub(shape),
                Py::Name("numpy.dtype".into()).sub(vec![dtype]),
            ])
        }
    }
}

impl Py {
    fn sub(self, items: Vec<Py>) -> Py {
        Py::Sub(Box::new(self), items)
    }

    /// The stub type of a return annotation (see the module's docs).
    pub fn to_stub(&self) -> Py {
        match self {
            Py::Name(n) if n == "dlcast.Array" => any(),
            Py::Name(n) => match FRAMEWORKS.iter().find(|f| f.python_type == n) {
                Some(f) if f.python_type == "numpy.ndarray" => numpy_type(&[]),
                Some(f) => Py::Name(f.stub.ty.into()),
                None => self.clone(),
            },
            Py::Call(..) | Py::Ellipsis => any(),
            Py::Sub(value, parts) => match &**value {
                Py::Name(n) if n == "numpy.ndarray" => numpy_type(parts),
                Py::Name(n)
                    if n == "dlcast.Array" || FRAMEWORKS.iter().any(|f| f.python_type == n) =>
                {
                    value.to_stub()
                }
                Py::Call(..) => any(),
                _ => Py::Sub(
                    Box::new(value.to_stub()),
                    parts.iter().map(Py::to_stub).collect(),
                ),
            },
            Py::Tuple(items) => Py::Tuple(items.iter().map(Py::to_stub).collect()),
            Py::Union(items) => Py::Union(items.iter().map(Py::to_stub).collect()),
            Py::Int(_) | Py::Str(_) => self.clone(),
        }
    }

    /// The `PyStaticExpr` of this expression (`pyo3` is the crate's path).
    pub fn to_tokens(&self, pyo3: &TokenStream) -> TokenStream {
        let e = quote!(#pyo3::inspect::PyStaticExpr);
        let c = quote!(#pyo3::inspect::PyStaticConstant);
        match self {
            Py::Name(n) if n == "None" => quote!(#e::Constant { value: #c::None }),
            Py::Name(n) => match n.rsplit_once('.') {
                Some((module, attr)) => {
                    quote!(#e::Attribute { value: &#e::Name { id: #module }, attr: #attr })
                }
                None => quote!(#e::Name { id: #n }),
            },
            Py::Int(n) => quote!(#e::Constant { value: #c::Int(#n) }),
            Py::Str(s) => quote!(#e::Constant { value: #c::Str(#s) }),
            Py::Ellipsis => quote!(#e::Constant { value: #c::Ellipsis }),
            Py::Sub(value, items) => {
                let value = value.to_tokens(pyo3);
                let slice = if items.len() == 1 {
                    items[0].to_tokens(pyo3)
                } else {
                    Py::Tuple(items.clone()).to_tokens(pyo3)
                };
                quote!(#e::Subscript { value: &#value, slice: &#slice })
            }
            Py::Tuple(items) => {
                let items = items.iter().map(|i| i.to_tokens(pyo3));
                quote!(#e::Tuple { elts: &[#(#items),*] })
            }
            Py::Union(items) => {
                let mut it = items.iter().rev();
                let mut acc = it.next().map(|i| i.to_tokens(pyo3)).unwrap_or_default();
                for left in it {
                    let left = left.to_tokens(pyo3);
                    acc = quote!(#e::BinOp {
                        left: &#left,
                        op: #pyo3::inspect::PyStaticOperator::BitOr,
                        right: &#acc,
                    });
                }
                acc
            }
            Py::Call(..) => any().to_tokens(pyo3),
        }
    }
}

/// The hint of an array parameter: `typing.Annotated[typing.Any, "<the
/// signature line's annotation>"]`.
pub fn param_hint(annotation: &str) -> Py {
    Py::Name("typing.Annotated".into()).sub(vec![any(), Py::Str(annotation.into())])
}

/// The hint of a result from the signature line's return annotation;
/// `typing.Any` where it cannot be parsed.
pub fn return_hint(annotation: &str) -> Py {
    parse(annotation).map_or_else(any, |p| p.to_stub())
}

/// What the exported function changes for PyO3's introspection, with the
/// `inspect` feature (without it, nothing): the arrays come in as
/// `In<Marker>` and the result goes out as `Out<Marker>`, each marker type
/// carrying its hint.
pub struct Inspect {
    /// The exported function's parameters.
    pub outer_params: Vec<TokenStream>,
    /// The marker types (items beside the function or `impl` block).
    pub items: TokenStream,
    /// Rebinds each array argument to the `&Bound<PyAny>` the body code takes.
    pub unwrap_args: TokenStream,
    /// The result type, where the result is wrapped (`Out<Marker>`).
    pub ret_ty: Option<TokenStream>,
}

impl Inspect {
    /// `base` names the function uniquely in its module; `hints` are the
    /// views' parameter hints, in order; `ret` the return annotation of the
    /// signature line, `None` where the result is not converted (special
    /// methods, setters).
    pub fn new(
        base: &str,
        views: &[ViewParam],
        hints: &[Py],
        mut outer_params: Vec<TokenStream>,
        ret: Option<&str>,
    ) -> Inspect {
        let (mut items, mut unwrap_args) = (quote!(), quote!());
        if !cfg!(feature = "inspect") {
            return Inspect {
                outer_params,
                items,
                unwrap_args,
                ret_ty: None,
            };
        }
        let rt = quote!(::dlcast_runtime::__private);
        let pyo3 = quote!(#rt::pyo3);
        let base: String = base
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let mut marker = |suffix: &str, hint: &Py| {
            let m = format_ident!("__DlcastHint{base}__{suffix}");
            let hint = hint.to_tokens(&pyo3);
            items.extend(quote! {
                #[doc(hidden)]
                #[allow(non_camel_case_types)]
                pub struct #m;
                impl #rt::Hint for #m {
                    const HINT: #pyo3::inspect::PyStaticExpr = #hint;
                }
            });
            m
        };
        for (v, hint) in views.iter().zip(hints) {
            let ident = &v.ident;
            let typed = |p: &TokenStream| match syn::parse2::<FnArg>(p.clone()) {
                Ok(FnArg::Typed(pt)) => Some(pt),
                _ => None,
            };
            let slot = outer_params.iter_mut().find(|p| {
                typed(p)
                    .is_some_and(|pt| matches!(&*pt.pat, syn::Pat::Ident(pi) if pi.ident == *ident))
            });
            let Some(slot) = slot else { continue };
            let Some(mut arg) = typed(slot) else { continue };
            let m = marker(&ident.unraw().to_string(), hint);
            if v.optional {
                *arg.ty = syn::parse_quote!(::core::option::Option<#rt::In<'_, '_, #m>>);
                unwrap_args.extend(quote!(let #ident = #ident.as_ref().map(#rt::In::get);));
            } else {
                *arg.ty = syn::parse_quote!(#rt::In<'_, '_, #m>);
                unwrap_args.extend(quote!(let #ident = #ident.get();));
            }
            *slot = quote!(#arg);
        }
        let ret_ty = ret.map(|ret| {
            let m = marker("return", &return_hint(ret));
            quote!(#rt::Out<#m>)
        });
        Inspect {
            outer_params,
            items,
            unwrap_args,
            ret_ty,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stub(text: &str) -> String {
        show(&return_hint(text))
    }

    /// Python's spelling of an expression (for the tests).
    fn show(p: &Py) -> String {
        match p {
            Py::Name(n) | Py::Int(n) => n.clone(),
            Py::Str(s) => format!("{s:?}"),
            Py::Ellipsis => "...".into(),
            Py::Sub(v, items) => {
                let items: Vec<String> = items.iter().map(show).collect();
                format!("{}[{}]", show(v), items.join(", "))
            }
            Py::Tuple(items) if items.is_empty() => "()".into(),
            Py::Tuple(items) => format!(
                "({})",
                items.iter().map(show).collect::<Vec<_>>().join(", ")
            ),
            Py::Union(items) => items.iter().map(show).collect::<Vec<_>>().join(" | "),
            Py::Call(f, items) => format!(
                "{f}({})",
                items.iter().map(show).collect::<Vec<_>>().join(", ")
            ),
        }
    }

    #[test]
    fn returns_become_stub_types() {
        assert_eq!(
            stub("numpy.ndarray[float32, (_, _)]"),
            "numpy.ndarray[tuple[int, int], numpy.dtype[numpy.float32]]"
        );
        assert_eq!(
            stub("numpy.ndarray[float64]"),
            "numpy.typing.NDArray[numpy.float64]"
        );
        assert_eq!(
            stub("numpy.ndarray[bfloat16]"),
            "numpy.typing.NDArray[typing.Any]"
        );
        assert_eq!(
            stub("numpy.ndarray[int8, ()]"),
            "numpy.ndarray[tuple[()], numpy.dtype[numpy.int8]]"
        );
        assert_eq!(stub("numpy.ndarray"), "numpy.typing.NDArray[typing.Any]");
        assert_eq!(stub("torch.Tensor[float32, (_,)]"), "torch.Tensor");
        assert_eq!(
            stub("array_api_strict.Array"),
            "array_api_strict._array_object.Array"
        );
        assert_eq!(stub("like(x)[float32]"), "typing.Any");
        assert_eq!(
            stub("tuple[like(x), float] | None"),
            "tuple[typing.Any, float] | None"
        );
        assert_eq!(stub("dlcast.Array[float32]"), "typing.Any");
        assert_eq!(stub("list[tuple[int, str]]"), "list[tuple[int, str]]");
        assert_eq!(stub("..."), "typing.Any");
    }

    #[test]
    fn every_framework_has_a_stub_type() {
        for f in FRAMEWORKS {
            assert_eq!(
                stub(f.python_type),
                if f.python_type == "numpy.ndarray" {
                    "numpy.typing.NDArray[typing.Any]".to_string()
                } else {
                    f.stub.ty.to_string()
                }
            );
        }
    }

    #[test]
    fn parameters_keep_the_constraint_text() {
        assert_eq!(
            show(&param_hint("ndarray[float32, (n, 3), cpu]")),
            "typing.Annotated[typing.Any, \"ndarray[float32, (n, 3), cpu]\"]"
        );
        assert!(parse("ndarray[float32 | float64, (n, 3), cuda(0) | cpu, writable]").is_some());
    }
}
