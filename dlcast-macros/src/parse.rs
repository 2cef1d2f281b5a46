//! Parsing: the options of `#[dlpack_fn(..)]` and what a parameter's or
//! return type is, read from its spelling (a proc macro sees no types).

use proc_macro2::TokenStream as TokenStream2;
use quote::quote;
use syn::{
    Attribute, Error, FnArg, GenericArgument, Ident, PathArguments, ReturnType, Signature, Type,
};

use crate::facts::{Framework, FRAMEWORKS};
use crate::stream;

/// `ty` without the invisible groups a `macro_rules` `$t:ty` fragment adds,
/// and without parentheses.
pub(crate) fn ungroup(ty: &Type) -> &Type {
    match ty {
        Type::Group(g) => ungroup(&g.elem),
        Type::Paren(p) => ungroup(&p.elem),
        _ => ty,
    }
}

/// The kinds of array parameter, recognised by the type's spelling: dlcast's
/// views by their last path segment, `ndarray`'s views by theirs (and their
/// aliases `ArrayView2`, `ArrayViewD`, ...), slices by `&[T]` / `&mut [T]`.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum ViewKind {
    Ref,
    Mut,
    Dyn,
    DynMut,
    /// `ndarray::ArrayView<'_, T, D>`.
    Nd,
    /// `ndarray::ArrayViewMut<'_, T, D>`.
    NdMut,
    /// `&[T]`.
    Slice,
    /// `&mut [T]`.
    SliceMut,
}

impl ViewKind {
    fn of(ty: &Type) -> Option<Self> {
        if let Type::Reference(r) = ungroup(ty) {
            if !matches!(ungroup(&r.elem), Type::Slice(_)) {
                return None;
            }
            return Some(if r.mutability.is_some() {
                ViewKind::SliceMut
            } else {
                ViewKind::Slice
            });
        }
        let Type::Path(p) = ungroup(ty) else {
            return None;
        };
        let last = p.path.segments.last()?.ident.to_string();
        Some(match last.as_str() {
            "TensorRef" => ViewKind::Ref,
            "TensorMut" => ViewKind::Mut,
            "TensorDyn" => ViewKind::Dyn,
            "TensorDynMut" => ViewKind::DynMut,
            s if s.starts_with("ArrayViewMut") && nd_suffix(&s[12..]).is_some() => ViewKind::NdMut,
            s if s.starts_with("ArrayView") && nd_suffix(&s[9..]).is_some() => ViewKind::Nd,
            _ => return None,
        })
    }

    pub(crate) fn writable(self) -> bool {
        matches!(
            self,
            ViewKind::Mut | ViewKind::DynMut | ViewKind::NdMut | ViewKind::SliceMut
        )
    }

    /// Whether the type is Rust's own (`&[T]`, an `ndarray` view): it needs
    /// aligned host memory, guaranteed at the boundary.
    pub(crate) fn native(self) -> bool {
        matches!(
            self,
            ViewKind::Nd | ViewKind::NdMut | ViewKind::Slice | ViewKind::SliceMut
        )
    }
}

/// The rank an `ndarray` type name's suffix fixes: `""` (the generic
/// `ArrayView<'_, T, D>`, read from `D`), `"D"` (dynamic), `"0"`..`"6"`.
/// `Some(None)` for dynamic or generic, `None` for no `ndarray` view name.
fn nd_suffix(s: &str) -> Option<Option<usize>> {
    match s {
        "" | "D" => Some(None),
        _ => s.parse::<usize>().ok().filter(|n| *n <= 6).map(Some),
    }
}

/// The number of dimensions an array parameter's type fixes, if any:
/// `&[T]` is 1-D; `ArrayView2`, `ArrayView<'_, T, Ix2>` (or
/// `Dim<[usize; 2]>`) and `TensorRef<'_, T, 2>` are 2-D; `ArrayViewD`,
/// `IxDyn` and `TensorRef<'_, T>` any. An `ndarray` dimension type dlcast
/// cannot read is an error at it.
pub(crate) fn static_rank(ty: &Type, kind: ViewKind) -> syn::Result<Option<usize>> {
    if matches!(kind, ViewKind::Slice | ViewKind::SliceMut) {
        return Ok(Some(1));
    }
    let Type::Path(p) = ungroup(ty) else {
        return Ok(None);
    };
    let Some(last) = p.path.segments.last() else {
        return Ok(None);
    };
    let args: Vec<&GenericArgument> = match &last.arguments {
        PathArguments::AngleBracketed(a) => a.args.iter().collect(),
        _ => Vec::new(),
    };
    let name = last.ident.to_string();
    match kind {
        ViewKind::Nd | ViewKind::NdMut => {
            let suffix = name
                .trim_start_matches("ArrayViewMut")
                .trim_start_matches("ArrayView");
            if !suffix.is_empty() {
                return Ok(nd_suffix(suffix).flatten());
            }
            // `ArrayView<'a, T, D>`: `D` is the second type argument.
            let types: Vec<&Type> = args
                .iter()
                .filter_map(|g| match g {
                    GenericArgument::Type(t) => Some(ungroup(t)),
                    _ => None,
                })
                .collect();
            let Some(dim) = types.get(1) else {
                return Err(Error::new_spanned(
                    ty,
                    "write the dimension, e.g. `ArrayView<'_, f32, Ix2>` or `ArrayView2<'_, f32>`",
                ));
            };
            dim_rank(dim).ok_or_else(|| {
                Error::new_spanned(
                    dim,
                    "the dimension of an array parameter must be `Ix0` .. `Ix6`, `IxDyn` \
                     or `Dim<[usize; N]>`",
                )
            })
        }
        ViewKind::Ref | ViewKind::Mut => Ok(args.iter().find_map(|g| match g {
            GenericArgument::Const(syn::Expr::Lit(l)) => match &l.lit {
                syn::Lit::Int(i) => i.base10_parse::<usize>().ok(),
                _ => None,
            },
            _ => None,
        })),
        _ => Ok(None),
    }
}

/// The rank of an `ndarray` dimension type: `Some(Some(n))` for `IxN` and
/// `Dim<[usize; N]>`, `Some(None)` for `IxDyn`, `None` for anything else.
fn dim_rank(dim: &Type) -> Option<Option<usize>> {
    let Type::Path(p) = dim else { return None };
    let last = p.path.segments.last()?;
    let name = last.ident.to_string();
    if name == "IxDyn" {
        return Some(None);
    }
    if let Some(n) = name.strip_prefix("Ix") {
        return n.parse::<usize>().ok().filter(|n| *n <= 6).map(Some);
    }
    if name == "Dim" {
        let PathArguments::AngleBracketed(a) = &last.arguments else {
            return None;
        };
        if let Some(GenericArgument::Type(Type::Array(arr))) = a.args.first() {
            if let syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Int(i),
                ..
            }) = &arr.len
            {
                return i.base10_parse::<usize>().ok().filter(|n| *n <= 6).map(Some);
            }
        }
    }
    None
}

/// An `ndarray` view (`ArrayView2<'_, f32>`, ...) anywhere in `ty`
/// (inside `PyResult`, `Option`, tuples, `Vec`): it cannot be returned.
pub(crate) fn find_nd_view(ty: &Type) -> Option<&Type> {
    match ungroup(ty) {
        Type::Tuple(t) => t.elems.iter().find_map(find_nd_view),
        Type::Array(a) => find_nd_view(&a.elem),
        Type::Slice(s) => find_nd_view(&s.elem),
        Type::Reference(r) => find_nd_view(&r.elem),
        t @ Type::Path(p) => {
            if matches!(ViewKind::of(t), Some(ViewKind::Nd | ViewKind::NdMut)) {
                return Some(t);
            }
            p.path.segments.iter().find_map(|s| match &s.arguments {
                PathArguments::AngleBracketed(a) => a.args.iter().find_map(|g| match g {
                    GenericArgument::Type(t) => find_nd_view(t),
                    _ => None,
                }),
                _ => None,
            })
        }
        _ => None,
    }
}

/// The type inside `Option<..>`, if `ty` is spelled as an `Option`.
pub(crate) fn option_inner(ty: &Type) -> Option<&Type> {
    let Type::Path(p) = ungroup(ty) else {
        return None;
    };
    let last = p.path.segments.last()?;
    if last.ident != "Option" {
        return None;
    }
    match &last.arguments {
        PathArguments::AngleBracketed(a) if a.args.len() == 1 => match &a.args[0] {
            GenericArgument::Type(t) => Some(ungroup(t)),
            _ => None,
        },
        _ => None,
    }
}

/// An error for a view type spelled with the lifetime `'static`: the view
/// must not outlive the call. (`'_` and lifetime parameters of the
/// function are chosen by the generated caller, so they cannot.)
pub(crate) fn named_lifetime(view: &Type) -> Option<Error> {
    if let Type::Reference(r) = ungroup(view) {
        return r
            .lifetime
            .as_ref()
            .filter(|l| l.ident == "static")
            .map(|l| {
                Error::new_spanned(
                    l,
                    "a slice borrows its Python argument for the call only; \
                 write `&[T]` (or a lifetime parameter) instead of `&'static [T]`",
                )
            });
    }
    let Type::Path(p) = ungroup(view) else {
        return None;
    };
    let PathArguments::AngleBracketed(a) = &p.path.segments.last()?.arguments else {
        return None;
    };
    a.args.iter().find_map(|g| match g {
        GenericArgument::Lifetime(l) if l.ident == "static" => Some(Error::new_spanned(
            l,
            "a view borrows its Python argument for the call only; \
             write `'_` (or a lifetime parameter) instead of `'static`",
        )),
        _ => None,
    })
}

/// Whether the body returns a `PyResult<T>` / `Result<T, E>` (its error
/// then converts with `?`), judged by the last path segment.
pub(crate) fn returns_result(ret: &ReturnType) -> bool {
    let ReturnType::Type(_, ty) = ret else {
        return false;
    };
    matches!(&**ty, Type::Path(p) if p.path.segments.last().is_some_and(|l| {
        (l.ident == "PyResult" || l.ident == "Result")
            && matches!(l.arguments, PathArguments::AngleBracketed(_))
    }))
}

/// The type of the body's value: `T` of a `PyResult<T>` / `Result<T, E>`,
/// `()` for no return type, else the return type.
pub(crate) fn body_value_type(ret: &ReturnType) -> TokenStream2 {
    let ReturnType::Type(_, ty) = ret else {
        return quote!(());
    };
    if returns_result(ret) {
        if let Type::Path(p) = &**ty {
            if let Some(PathArguments::AngleBracketed(a)) =
                p.path.segments.last().map(|l| &l.arguments)
            {
                if let Some(GenericArgument::Type(t)) = a.args.first() {
                    return quote!(#t);
                }
            }
        }
    }
    quote!(#ty)
}

/// Whether the body returns nothing: no return type, `()`, or a
/// `PyResult<()>` / `Result<(), E>`. Python then gets `None` (PyO3 would turn
/// a unit value into an empty tuple).
pub(crate) fn returns_unit(ret: &ReturnType) -> bool {
    let ReturnType::Type(_, ty) = ret else {
        return true;
    };
    let is_unit = |t: &Type| matches!(t, Type::Tuple(tt) if tt.elems.is_empty());
    if is_unit(ty) {
        return true;
    }
    let Type::Path(p) = &**ty else { return false };
    let Some(last) = p.path.segments.last() else {
        return false;
    };
    if last.ident != "PyResult" && last.ident != "Result" {
        return false;
    }
    match &last.arguments {
        PathArguments::AngleBracketed(a) => {
            matches!(a.args.first(), Some(GenericArgument::Type(t)) if is_unit(t))
        }
        _ => false,
    }
}

/// `returns = ...` of `#[dlpack_fn(...)]`.
#[derive(Clone)]
pub(crate) enum Returns {
    /// A framework, and the span of its name.
    Framework(Framework, proc_macro2::Span),
    /// `like(param)`: the framework of that argument, decided per call.
    Like(Ident),
    /// `dlcast`: the `dlcast.Array` itself, handed to no framework.
    Dlcast,
}

/// Options of `#[dlpack_fn(...)]`.
#[derive(Default, Clone)]
pub(crate) struct FnOptions {
    pub(crate) returns: Option<Returns>,
    /// `noconvert`: no implicit conversion for any parameter.
    pub(crate) noconvert: bool,
    /// `stream = ...`: the runtime's `StreamRequest` variant.
    pub(crate) stream: Option<Ident>,
    /// `returns` comes from the impl block, for every method: methods
    /// without arrays to return ignore it.
    pub(crate) returns_inherited: bool,
}

pub(crate) fn parse_options(attr: TokenStream2) -> syn::Result<FnOptions> {
    let mut opts = FnOptions::default();
    let parser = syn::meta::parser(|meta| {
        if meta.path.is_ident("returns") {
            if opts.returns.is_some() {
                return Err(meta.error("duplicate `returns`"));
            }
            let value: Ident = meta.value()?.parse()?;
            if value == "dlcast" {
                opts.returns = Some(Returns::Dlcast);
                return Ok(());
            }
            if value == "like" {
                let inner;
                syn::parenthesized!(inner in meta.input);
                opts.returns = Some(Returns::Like(inner.parse()?));
                return Ok(());
            }
            let Some(f) = FRAMEWORKS.iter().find(|f| value == f.option) else {
                let names: Vec<&str> = FRAMEWORKS.iter().map(|f| f.option).collect();
                return Err(Error::new_spanned(
                    &value,
                    format!(
                        "unknown framework `{value}`; expected one of: {}, dlcast, or like(<parameter>)",
                        names.join(", ")
                    ),
                ));
            };
            opts.returns = Some(Returns::Framework(f.id, value.span()));
            Ok(())
        } else if meta.path.is_ident("noconvert") {
            if opts.noconvert {
                return Err(meta.error("duplicate `noconvert`"));
            }
            opts.noconvert = true;
            Ok(())
        } else if meta.path.is_ident("stream") {
            stream::parse_option(&meta, &mut opts.stream)
        } else {
            Err(meta.error(
                "unknown #[dlpack_fn] option; expected `returns = <framework>`, \
                 `returns = like(<parameter>)`, `noconvert` or `stream = <stream>`",
            ))
        }
    });
    syn::parse::Parser::parse2(parser, attr)?;
    Ok(opts)
}

/// Whether `attrs` holds `#[name]` (under any path, e.g. `pyo3::name`).
pub(crate) fn has_attr(attrs: &[Attribute], name: &str) -> bool {
    attrs
        .iter()
        .any(|a| a.path().segments.last().is_some_and(|s| s.ident == name))
}

/// The options of `#[dlcast::pyfunction(..)]` / `#[dlcast::pymethods(..)]`,
/// split by name: dlcast's own (`returns`, `noconvert`, `stream`) and the
/// rest, passed to PyO3's attribute as written.
pub(crate) fn split_options(attr: TokenStream2) -> syn::Result<(FnOptions, TokenStream2)> {
    let (mut ours, mut theirs) = (Vec::<TokenStream2>::new(), Vec::<TokenStream2>::new());
    let mut current = TokenStream2::new();
    let mut flush = |current: &mut TokenStream2| {
        let item = std::mem::take(current);
        let first = item.clone().into_iter().next();
        match first {
            None => {}
            Some(proc_macro2::TokenTree::Ident(i))
                if i == "returns" || i == "noconvert" || i == "stream" =>
            {
                ours.push(item)
            }
            Some(_) => theirs.push(item),
        }
    };
    for t in attr {
        match &t {
            proc_macro2::TokenTree::Punct(p) if p.as_char() == ',' => flush(&mut current),
            _ => current.extend([t]),
        }
    }
    flush(&mut current);
    Ok((parse_options(quote!(#(#ours),*))?, quote!(#(#theirs),*)))
}

/// Takes a method's own `#[dlpack_fn(..)]` or `#[dlcast(..)]` (inside a
/// `#[dlpack_fn]` / `#[dlcast::pymethods]` impl).
pub(crate) fn take_method_options(attrs: &mut Vec<Attribute>) -> syn::Result<Option<FnOptions>> {
    let Some(pos) = attrs
        .iter()
        .position(|a| a.path().is_ident("dlpack_fn") || a.path().is_ident("dlcast"))
    else {
        return Ok(None);
    };
    let attr = attrs.remove(pos);
    match &attr.meta {
        syn::Meta::Path(_) => Ok(Some(FnOptions::default())),
        syn::Meta::List(l) => parse_options(l.tokens.clone()).map(Some),
        syn::Meta::NameValue(_) => Err(Error::new_spanned(attr, "write #[dlcast(..)]")),
    }
}

/// The view kind of a parameter type, looking inside `Option`.
pub(crate) fn view_kind_of(ty: &Type) -> Option<(bool, &Type, ViewKind)> {
    let (optional, inner) = match option_inner(ty) {
        Some(t) => (true, t),
        None => (false, ty),
    };
    let inner = ungroup(inner);
    ViewKind::of(inner).map(|k| (optional, inner, k))
}

pub(crate) fn has_array_params(sig: &Signature) -> bool {
    sig.inputs
        .iter()
        .any(|a| matches!(a, FnArg::Typed(pt) if view_kind_of(&pt.ty).is_some()))
}

/// The element type of `TensorRef<'_, T>` / `TensorMut<'_, T>`.
pub(crate) fn element_type(view: &Type) -> Option<&Type> {
    if let Type::Reference(r) = ungroup(view) {
        return match ungroup(&r.elem) {
            Type::Slice(s) => Some(ungroup(&s.elem)),
            _ => None,
        };
    }
    let Type::Path(p) = ungroup(view) else {
        return None;
    };
    let PathArguments::AngleBracketed(a) = &p.path.segments.last()?.arguments else {
        return None;
    };
    a.args.iter().find_map(|g| match g {
        GenericArgument::Type(t) => Some(ungroup(t)),
        _ => None,
    })
}

/// Whether `tokens` mention the identifier `id` anywhere.
pub(crate) fn mentions(tokens: TokenStream2, id: &Ident) -> bool {
    tokens.into_iter().any(|t| match t {
        proc_macro2::TokenTree::Ident(i) => i == *id,
        proc_macro2::TokenTree::Group(g) => mentions(g.stream(), id),
        _ => false,
    })
}

/// What a return type says about the arrays it may hold, by its spelling.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Holds {
    /// A dlcast array (`Tensor`, a view, `Array`), or a tuple, `Option` or
    /// `Vec` with one.
    Arrays,
    /// Nothing PyO3 turns into a `dlcast.Array` (numbers, strings, slices,
    /// `Vec`s of them): `returns = ..` has nothing to convert.
    NoArrays,
    /// A type dlcast cannot read (an alias, `Py<PyAny>`, a class): maybe.
    Unknown,
}

/// What the body's value type (see [`body_value_type`]) may hold.
pub(crate) fn return_holds(ret: &ReturnType) -> Holds {
    match ret {
        ReturnType::Default => Holds::NoArrays,
        ReturnType::Type(_, ty) if returns_result(ret) => match &**ty {
            Type::Path(p) => match p.path.segments.last().map(|l| &l.arguments) {
                Some(PathArguments::AngleBracketed(a)) => match a.args.first() {
                    Some(GenericArgument::Type(t)) => holds(t),
                    _ => Holds::Unknown,
                },
                _ => Holds::Unknown,
            },
            _ => Holds::Unknown,
        },
        ReturnType::Type(_, ty) => holds(ty),
    }
}

fn holds(ty: &Type) -> Holds {
    const SCALARS: &[&str] = &[
        "bool", "char", "i8", "i16", "i32", "i64", "i128", "isize", "u8", "u16", "u32", "u64",
        "u128", "usize", "f32", "f64", "String", "str",
    ];
    const ARRAYS: &[&str] = &[
        "Tensor",
        "TensorRef",
        "TensorMut",
        "TensorDyn",
        "TensorDynMut",
        "Array",
    ];
    match ungroup(ty) {
        Type::Tuple(t) => {
            let all: Vec<Holds> = t.elems.iter().map(holds).collect();
            if all.contains(&Holds::Arrays) {
                Holds::Arrays
            } else if all.iter().all(|h| *h == Holds::NoArrays) {
                Holds::NoArrays
            } else {
                Holds::Unknown
            }
        }
        Type::Reference(r) => match ungroup(&r.elem) {
            Type::Slice(_) | Type::Array(_) => Holds::NoArrays,
            other => holds(other),
        },
        Type::Slice(_) | Type::Array(_) => Holds::NoArrays,
        Type::Path(p) => {
            let Some(last) = p.path.segments.last() else {
                return Holds::Unknown;
            };
            let name = last.ident.to_string();
            let inner = || match &last.arguments {
                PathArguments::AngleBracketed(a) => a.args.iter().find_map(|g| match g {
                    GenericArgument::Type(t) => Some(holds(t)),
                    _ => None,
                }),
                _ => None,
            };
            if ARRAYS.contains(&name.as_str()) {
                Holds::Arrays
            } else if SCALARS.contains(&name.as_str()) {
                Holds::NoArrays
            } else if ["Option", "Vec", "Box", "Bound", "Py"].contains(&name.as_str()) {
                inner().unwrap_or(Holds::Unknown)
            } else {
                Holds::Unknown
            }
        }
        _ => Holds::Unknown,
    }
}
