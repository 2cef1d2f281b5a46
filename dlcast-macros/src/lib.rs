//! The `#[dlpack_fn]` attribute macro. Use it through `dlcast_runtime`,
//! which re-exports it and does all the work at run time; this crate only
//! parses, checks the annotations with precise spans, and emits one static
//! description of the constraints plus one runtime call per parameter.

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{
    parse_macro_input, Attribute, Block, Error, FnArg, GenericArgument, GenericParam, Ident,
    ImplItem, Item, ItemFn, ItemImpl, Pat, PathArguments, ReturnType, Signature, Type, Visibility,
};

mod annot;
mod pysig;
mod stream;

use annot::{Annotations, Dim};

/// Turns a `#[pyfunction]` whose parameters are dlcast views
/// (`TensorRef`, `TensorMut`, `TensorDyn`, `TensorDynMut`, or `Option` of
/// one) into a function that takes any DLPack producer from Python and
/// checks it against the parameter's annotations:
///
/// - `#[shape(n, 3)]`: integers (exact extent), `_` (any), names (equal
///   across the call's parameters), one `..` (any number of dimensions);
///   `#[shape()]` is 0-d; without it, any shape.
/// - `#[device(cpu, cuda(0), ..)]`: allowed devices, optionally with an id;
///   default `cpu`.
/// - `#[order(c | f | contiguous)]`: required memory order; default any.
/// - `#[noconvert]`: a read-only argument whose dtype or order does not fit
///   raises instead of being converted by its framework.
/// - `#[dtype(f32, f64)]` on a parameter whose element type is a type
///   parameter (`x: TensorRef<'_, T>`): the function is generic over `T`
///   and dispatches on the argument's dtype to the instance for it.
/// - `#[stream]` on an integer parameter (or `Option` of one): its value is
///   the stream handle CUDA/ROCm inputs are made ready on (`-1`: no
///   synchronisation; `None`: the default rule).
///
/// `#[dlpack_fn(stream = legacy | per_thread | no_sync)]` chooses the stream
/// for every CUDA/ROCm input of the function; the default (`producer`) is
/// the producer's current work stream where the DLPack C exchange API says
/// it, else the default stream (see `dlcast_runtime::stream`).
///
/// The function may return anything PyO3 converts, including dlcast's
/// owned `Tensor<T>` and views of its inputs (exported zero-copy as a
/// `dlcast.Array`), inside `Option`, `PyResult` or tuples.
///
/// Options: `#[dlpack_fn(returns = numpy)]` (or `torch`, `jax`, `cupy`,
/// `tensorflow`, `array_api`, `like(param)`) hands every returned array to
/// that framework instead; `#[dlpack_fn(noconvert)]` turns conversion off
/// for every parameter.
///
/// Place it above `#[pyfunction]`, or, for methods, on the `impl` block
/// above `#[pymethods]` (methods may carry their own `#[dlpack_fn(..)]`
/// options there).
#[proc_macro_attribute]
pub fn dlpack_fn(attr: TokenStream, item: TokenStream) -> TokenStream {
    let opts = match parse_options(attr.into()) {
        Ok(o) => o,
        Err(e) => return e.to_compile_error().into(),
    };
    let item = parse_macro_input!(item as Item);
    let out = match item {
        Item::Fn(func) => expand_fn(&opts, func),
        Item::Impl(imp) => expand_impl(&opts, imp),
        other => Err(Error::new_spanned(
            other,
            "#[dlpack_fn] applies to a function marked #[pyfunction], \
             or to an impl block marked #[pymethods]",
        )),
    };
    out.unwrap_or_else(|e| e.to_compile_error()).into()
}

/// `ty` without the invisible groups a `macro_rules` `$t:ty` fragment adds,
/// and without parentheses.
fn ungroup(ty: &Type) -> &Type {
    match ty {
        Type::Group(g) => ungroup(&g.elem),
        Type::Paren(p) => ungroup(&p.elem),
        _ => ty,
    }
}

/// The kinds of view parameter, recognised by the type's last path segment.
#[derive(Clone, Copy, PartialEq)]
enum ViewKind {
    Ref,
    Mut,
    Dyn,
    DynMut,
}

impl ViewKind {
    fn of(ty: &Type) -> Option<Self> {
        let Type::Path(p) = ungroup(ty) else {
            return None;
        };
        let last = p.path.segments.last()?;
        Some(match last.ident.to_string().as_str() {
            "TensorRef" => ViewKind::Ref,
            "TensorMut" => ViewKind::Mut,
            "TensorDyn" => ViewKind::Dyn,
            "TensorDynMut" => ViewKind::DynMut,
            _ => return None,
        })
    }

    fn writable(self) -> bool {
        matches!(self, ViewKind::Mut | ViewKind::DynMut)
    }
}

/// The type inside `Option<..>`, if `ty` is spelled as an `Option`.
fn option_inner(ty: &Type) -> Option<&Type> {
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
fn named_lifetime(view: &Type) -> Option<Error> {
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

/// The lifetime a view type is spelled with, if any.
fn view_lifetime(view: &Type) -> Option<syn::Lifetime> {
    let Type::Path(p) = ungroup(view) else {
        return None;
    };
    let PathArguments::AngleBracketed(a) = &p.path.segments.last()?.arguments else {
        return None;
    };
    a.args.iter().find_map(|g| match g {
        GenericArgument::Lifetime(l) => Some(l.clone()),
        _ => None,
    })
}

/// An array parameter after parsing.
struct ViewParam {
    ident: Ident,
    ty: Type,
    optional: bool,
    kind: ViewKind,
    annots: Annotations,
    /// Index into the function's type parameters, if the element type is one.
    tparam: Option<usize>,
}

/// Whether the body returns a `PyResult<T>` / `Result<T, E>` (its error
/// then converts with `?`), judged by the last path segment.
fn returns_result(ret: &ReturnType) -> bool {
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
fn body_value_type(ret: &ReturnType) -> TokenStream2 {
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
fn returns_unit(ret: &ReturnType) -> bool {
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

/// The frameworks `returns = ...` accepts and the runtime's names for them.
const FRAMEWORKS: &[(&str, &str)] = &[
    ("numpy", "Numpy"),
    ("torch", "Torch"),
    ("jax", "Jax"),
    ("cupy", "Cupy"),
    ("tensorflow", "Tensorflow"),
    ("array_api", "ArrayApi"),
    ("memoryview", "Memoryview"),
    ("mlx", "Mlx"),
    ("paddle", "Paddle"),
];

/// `returns = ...` of `#[dlpack_fn(...)]`.
#[derive(Clone)]
enum Returns {
    /// A framework: the runtime's `Framework` variant.
    Framework(Ident),
    /// `like(param)`: the framework of that argument, decided per call.
    Like(Ident),
}

/// Options of `#[dlpack_fn(...)]`.
#[derive(Default, Clone)]
struct FnOptions {
    returns: Option<Returns>,
    /// `noconvert`: no implicit conversion for any parameter.
    noconvert: bool,
    /// `stream = ...`: the runtime's `StreamRequest` variant.
    stream: Option<Ident>,
}

fn parse_options(attr: TokenStream2) -> syn::Result<FnOptions> {
    let mut opts = FnOptions::default();
    let parser = syn::meta::parser(|meta| {
        if meta.path.is_ident("returns") {
            if opts.returns.is_some() {
                return Err(meta.error("duplicate `returns`"));
            }
            let value: Ident = meta.value()?.parse()?;
            if value == "like" {
                let inner;
                syn::parenthesized!(inner in meta.input);
                opts.returns = Some(Returns::Like(inner.parse()?));
                return Ok(());
            }
            let Some((_, variant)) = FRAMEWORKS.iter().find(|(n, _)| value == n) else {
                let names: Vec<&str> = FRAMEWORKS.iter().map(|(n, _)| *n).collect();
                return Err(Error::new_spanned(
                    &value,
                    format!(
                        "unknown framework `{value}`; expected one of: {}, or like(<parameter>)",
                        names.join(", ")
                    ),
                ));
            };
            opts.returns = Some(Returns::Framework(Ident::new(variant, value.span())));
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

/// Where the expanded function lives.
enum Ctx {
    /// A free `#[pyfunction]`: the body becomes a nested `fn`.
    Free,
    /// A method of a `#[pymethods]` block: the body becomes an associated
    /// function of a second, plain `impl` block (PyO3 would export every
    /// function of the `#[pymethods]` block). Holds the class's name.
    Method(String),
}

/// The class name `Self` stands for, in a method.
fn self_name(ctx: &Ctx) -> Option<&str> {
    match ctx {
        Ctx::Free => None,
        Ctx::Method(name) => Some(name),
    }
}

/// Whether `attrs` holds `#[name]` (under any path, e.g. `pyo3::name`).
fn has_attr(attrs: &[Attribute], name: &str) -> bool {
    attrs
        .iter()
        .any(|a| a.path().segments.last().is_some_and(|s| s.ident == name))
}

/// The error for `#[dlpack_fn]` that PyO3's macro has already seen.
fn misplaced(span: &impl quote::ToTokens) -> Error {
    Error::new_spanned(
        span,
        "#[dlpack_fn] must come before PyO3 sees the function: place it above \
         #[pyfunction], or, for methods, on the impl block above #[pymethods]",
    )
}

fn expand_fn(opts: &FnOptions, mut func: ItemFn) -> syn::Result<TokenStream2> {
    if !has_attr(&func.attrs, "pyfunction") {
        let err = misplaced(&func.sig.ident).to_compile_error();
        // Strip dlcast's annotations so that only this error (and PyO3's
        // note on the view types) is reported.
        for arg in func.sig.inputs.iter_mut() {
            if let FnArg::Typed(pt) = arg {
                let _ = annot::take(&mut pt.attrs);
            }
        }
        return Ok(quote!(#err #func));
    }
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = func;
    let g = expand_callable(opts, &attrs, &vis, &sig, &block, &Ctx::Free)?;
    Ok(g.wrapper)
}

fn expand_impl(opts: &FnOptions, mut imp: ItemImpl) -> syn::Result<TokenStream2> {
    if !has_attr(&imp.attrs, "pymethods") {
        let err = Error::new_spanned(
            &imp.self_ty,
            "#[dlpack_fn] on an impl block must be placed above #[pymethods]",
        )
        .to_compile_error();
        return Ok(quote!(#err #imp));
    }
    let mut bodies = Vec::new();
    let mut errors: Option<Error> = None;
    for item in imp.items.iter_mut() {
        let ImplItem::Fn(m) = item else { continue };
        let own = match take_method_options(&mut m.attrs) {
            Ok(o) => o,
            Err(e) => {
                combine(&mut errors, e);
                continue;
            }
        };
        if own.is_none() && !has_array_params(&m.sig) {
            continue;
        }
        let mut mopts = own.unwrap_or_default();
        mopts.noconvert |= opts.noconvert;
        if mopts.returns.is_none() {
            mopts.returns = opts.returns.clone();
        }
        if mopts.stream.is_none() {
            mopts.stream = opts.stream.clone();
        }
        let class = match &*imp.self_ty {
            Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
            _ => None,
        };
        let ctx = Ctx::Method(class.unwrap_or_else(|| "...".into()));
        match expand_callable(&mopts, &m.attrs, &m.vis, &m.sig, &m.block, &ctx) {
            Ok(g) => {
                *m = syn::parse2(g.wrapper)?;
                bodies.push(g.body);
            }
            Err(e) => combine(&mut errors, e),
        }
    }
    if let Some(e) = errors {
        return Err(e);
    }
    let (impl_generics, _, where_clause) = imp.generics.split_for_impl();
    let self_ty = &imp.self_ty;
    Ok(quote! {
        #imp
        impl #impl_generics #self_ty #where_clause {
            #(#bodies)*
        }
    })
}

fn combine(errors: &mut Option<Error>, e: Error) {
    match errors {
        Some(all) => all.combine(e),
        None => *errors = Some(e),
    }
}

/// Takes a method's own `#[dlpack_fn(..)]` (inside a `#[dlpack_fn]` impl).
fn take_method_options(attrs: &mut Vec<Attribute>) -> syn::Result<Option<FnOptions>> {
    let Some(pos) = attrs.iter().position(|a| a.path().is_ident("dlpack_fn")) else {
        return Ok(None);
    };
    let attr = attrs.remove(pos);
    match &attr.meta {
        syn::Meta::Path(_) => Ok(Some(FnOptions::default())),
        syn::Meta::List(l) => parse_options(l.tokens.clone()).map(Some),
        syn::Meta::NameValue(_) => Err(Error::new_spanned(attr, "write #[dlpack_fn(..)]")),
    }
}

/// The view kind of a parameter type, looking inside `Option`.
fn view_kind_of(ty: &Type) -> Option<(bool, &Type, ViewKind)> {
    let (optional, inner) = match option_inner(ty) {
        Some(t) => (true, t),
        None => (false, ty),
    };
    let inner = ungroup(inner);
    ViewKind::of(inner).map(|k| (optional, inner, k))
}

fn has_array_params(sig: &Signature) -> bool {
    sig.inputs
        .iter()
        .any(|a| matches!(a, FnArg::Typed(pt) if view_kind_of(&pt.ty).is_some()))
}

/// A type parameter of a dtype-generic function.
struct TypeParam {
    ident: Ident,
    /// `#[dtype(..)]` of the deciding parameter.
    dtypes: Vec<Ident>,
    /// Index into the views of the parameter that carries `#[dtype(..)]`.
    decided_by: Option<usize>,
}

/// The element type of `TensorRef<'_, T>` / `TensorMut<'_, T>`.
fn element_type(view: &Type) -> Option<&Type> {
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
fn mentions(tokens: TokenStream2, id: &Ident) -> bool {
    tokens.into_iter().any(|t| match t {
        proc_macro2::TokenTree::Ident(i) => i == *id,
        proc_macro2::TokenTree::Group(g) => mentions(g.stream(), id),
        _ => false,
    })
}

/// The parameters of a function after parsing.
struct Analysis {
    views: Vec<ViewParam>,
    tparams: Vec<TypeParam>,
    /// The exported function's parameters (receiver included).
    outer_params: Vec<TokenStream2>,
    /// The body's arguments, in order (`self` first for a receiver).
    call_args: Vec<TokenStream2>,
    /// The Python-visible parameters and their annotations, in Rust order.
    py_params: Vec<(String, Option<String>)>,
    has_receiver: bool,
    /// The parameter marked `#[stream]`, if any.
    stream_param: Option<stream::StreamParam>,
}

/// Sorts a function's parameters into views, plain parameters and type
/// parameters, checking every annotation; all errors are reported together.
fn analyze(attrs: &[Attribute], sig: &Signature) -> syn::Result<Analysis> {
    let rt = quote!(::dlcast_runtime::__private);
    let pyo3 = quote!(#rt::pyo3);
    let mut errors: Option<Error> = None;
    let mut tparams: Vec<TypeParam> = Vec::new();
    for g in &sig.generics.params {
        match g {
            GenericParam::Type(tp) => tparams.push(TypeParam {
                ident: tp.ident.clone(),
                dtypes: Vec::new(),
                decided_by: None,
            }),
            GenericParam::Const(c) => combine(
                &mut errors,
                Error::new_spanned(c, "#[dlpack_fn] functions cannot have const parameters"),
            ),
            GenericParam::Lifetime(_) => {}
        }
    }
    let is_classmethod = has_attr(attrs, "classmethod");
    let mut a = Analysis {
        views: Vec::new(),
        tparams,
        outer_params: Vec::new(),
        call_args: Vec::new(),
        py_params: Vec::new(),
        has_receiver: false,
        stream_param: None,
    };
    let mut first_typed = true;
    // The first non-array parameter: a `slf: PyRef<'_, Self>` receiver, or
    // the module under `#[pyo3(pass_module)]`.
    let mut first_plain = true;
    let pass_module = pysig::scan_pyo3_attrs(attrs).pass_module;
    for arg in &sig.inputs {
        let pt = match arg {
            FnArg::Receiver(r) => {
                a.outer_params.push(quote!(#r));
                a.call_args.push(quote!(self));
                a.has_receiver = true;
                continue;
            }
            FnArg::Typed(pt) => pt,
        };
        let is_cls = is_classmethod && std::mem::take(&mut first_typed);
        let mut attrs = pt.attrs.clone();
        let stream_attr = match stream::take_attr(&mut attrs) {
            Ok(x) => x,
            Err(e) => {
                combine(&mut errors, e);
                continue;
            }
        };
        let annots = match annot::take(&mut attrs) {
            Ok(x) => x,
            Err(e) => {
                combine(&mut errors, e);
                continue;
            }
        };
        let Some((optional, inner, kind)) = view_kind_of(&pt.ty) else {
            if let Some(attr) = &annots.first {
                combine(
                    &mut errors,
                    Error::new_spanned(
                        attr,
                        "#[shape], #[device], #[order], #[dtype] and #[noconvert] apply to \
                         array parameters only (TensorRef, TensorMut, TensorDyn, TensorDynMut, \
                         or an Option of one)",
                    ),
                );
                continue;
            }
            if let Some(tp) = a
                .tparams
                .iter()
                .find(|tp| mentions(pt.ty.to_token_stream(), &tp.ident))
            {
                combine(
                    &mut errors,
                    Error::new_spanned(
                        &pt.ty,
                        format!(
                            "type parameter `{}` may only be the element type of array \
                             parameters (the dtype of the argument decides it)",
                            tp.ident
                        ),
                    ),
                );
                continue;
            }
            if let Some(attr) = stream_attr {
                if let Err(e) = stream::record(&mut a.stream_param, attr, pt) {
                    combine(&mut errors, e);
                    continue;
                }
            }
            let ty = &pt.ty;
            // The exported function binds the plain name (`mut k` is the
            // body's business); other patterns pass through.
            let pat = match &*pt.pat {
                Pat::Ident(pi) if pi.subpat.is_none() => pi.ident.to_token_stream(),
                other => other.to_token_stream(),
            };
            a.outer_params.push(quote!(#(#attrs)* #pat: #ty));
            a.call_args.push(pat);
            let is_python = matches!(ungroup(ty), Type::Path(p) if p.path.segments.last().is_some_and(|s| s.ident == "Python"));
            let is_self = first_plain
                && mentions(ty.to_token_stream(), &Ident::new("Self", Span::call_site()));
            let is_module = first_plain && pass_module;
            if is_self {
                a.has_receiver = true;
            }
            first_plain = false;
            if !is_python && !is_cls && !is_self && !is_module {
                if let Pat::Ident(pi) = &*pt.pat {
                    a.py_params.push((
                        pi.ident.unraw().to_string(),
                        pysig::python_type(ty, "typing.Any", None),
                    ));
                }
            }
            continue;
        };
        if let Some(attr) = &stream_attr {
            combine(&mut errors, stream::on_view_error(attr));
            continue;
        }
        if let Some(e) = named_lifetime(inner) {
            combine(&mut errors, e);
            continue;
        }
        let Pat::Ident(pi) = &*pt.pat else {
            combine(
                &mut errors,
                Error::new_spanned(
                    &pt.pat,
                    "an array parameter needs a plain name, e.g. `x: TensorRef<'_, f32>`",
                ),
            );
            continue;
        };
        let ident = pi.ident.clone();
        let index = a.views.len();
        let tparam = element_type(inner).and_then(|t| match t {
            Type::Path(p) if p.qself.is_none() => {
                let id = p.path.get_ident()?;
                a.tparams.iter().position(|tp| tp.ident == *id)
            }
            _ => None,
        });
        if let Some(list) = &annots.dtypes {
            let attr = annots.dtype_attr.as_ref().expect("set with dtypes");
            match tparam {
                None => combine(
                    &mut errors,
                    Error::new_spanned(
                        attr,
                        "#[dtype(..)] lists the dtypes a type parameter dispatches on; use it \
                         on a parameter whose element type is a type parameter of the \
                         function, e.g. `#[dtype(f32, f64)] x: TensorRef<'_, T>`",
                    ),
                ),
                Some(k) => {
                    let tp = &mut a.tparams[k];
                    if let Some(other) = tp.decided_by {
                        let other = &a.views[other].ident;
                        combine(
                            &mut errors,
                            Error::new_spanned(
                                attr,
                                format!(
                                    "the dtypes of `{}` are already listed on `{other}`",
                                    tp.ident
                                ),
                            ),
                        );
                    } else if optional {
                        tp.decided_by = Some(index); // no second error for `T`
                        combine(
                            &mut errors,
                            Error::new_spanned(
                                attr,
                                format!(
                                    "the parameter that decides `{}` cannot be an Option: \
                                     put #[dtype(..)] on a required parameter",
                                    tp.ident
                                ),
                            ),
                        );
                    } else {
                        tp.decided_by = Some(index);
                        tp.dtypes = list.clone();
                    }
                }
            }
        }
        // A view spelled with a lifetime parameter borrows the argument for
        // that lifetime (e.g. to return it).
        let lt =
            view_lifetime(inner).unwrap_or_else(|| syn::Lifetime::new("'_", Span::call_site()));
        let obj = if lt.ident == "_" {
            quote!(&#pyo3::Bound<'_, #pyo3::PyAny>)
        } else {
            quote!(&#lt #pyo3::Bound<#lt, #pyo3::PyAny>)
        };
        a.outer_params.push(if optional {
            quote!(#(#attrs)* #ident: ::core::option::Option<#obj>)
        } else {
            quote!(#(#attrs)* #ident: #obj)
        });
        a.call_args.push(quote!(#ident));
        first_plain = false;
        a.py_params.push((ident.unraw().to_string(), None));
        a.views.push(ViewParam {
            ident,
            ty: inner.clone(),
            optional,
            kind,
            annots,
            tparam,
        });
    }
    // After an error in the parameters, a missing `#[dtype]` is most likely
    // its consequence: report only the first.
    if let Some(e) = errors {
        return Err(e);
    }
    for tp in &a.tparams {
        if tp.decided_by.is_none() {
            combine(
                &mut errors,
                Error::new_spanned(
                    &tp.ident,
                    format!(
                        "type parameter `{0}` needs #[dtype(..)] on an array parameter whose \
                         element type is `{0}`, listing the dtypes to accept, e.g. \
                         `#[dtype(f32, f64)] x: TensorRef<'_, {0}>`",
                        tp.ident
                    ),
                ),
            );
        }
    }
    if let Some(e) = errors {
        return Err(e);
    }
    Ok(a)
}

/// The Rust element type for a `#[dtype(..)]` name.
fn dtype_type(name: &Ident) -> Type {
    let path = annot::DTYPES
        .iter()
        .find(|(n, _, _)| name == n)
        .map(|t| t.1)
        .expect("checked by annot");
    let mut ty: Type = syn::parse_str(path).expect("valid type path");
    respan(&mut ty, name.span());
    ty
}

/// Gives every token of `ty` the span `span` (for errors at the name).
fn respan(ty: &mut Type, span: Span) {
    let tokens: TokenStream2 = ty
        .to_token_stream()
        .into_iter()
        .map(|mut t| {
            t.set_span(span);
            t
        })
        .collect();
    *ty = syn::parse2(tokens).expect("same tokens");
}

use quote::ToTokens;
use syn::ext::IdentExt;

/// The NumPy name shown for a `#[dtype(..)]` name.
fn dtype_python_name(name: &Ident) -> &'static str {
    annot::DTYPES
        .iter()
        .find(|(n, _, _)| name == n)
        .map(|t| t.2)
        .expect("checked by annot")
}

/// The code generated for one function or method.
struct Generated {
    /// The exported function (or method).
    wrapper: TokenStream2,
    /// For methods: the body, an associated function for the plain impl.
    body: TokenStream2,
}

fn expand_callable(
    opts: &FnOptions,
    attrs: &[Attribute],
    vis: &Visibility,
    sig: &Signature,
    block: &Block,
    ctx: &Ctx,
) -> syn::Result<Generated> {
    let rt = quote!(::dlcast_runtime::__private);
    let pyo3 = quote!(#rt::pyo3);
    let a = analyze(attrs, sig)?;
    let views = &a.views;

    // Named extents, numbered in order of first use.
    let mut dim_names: Vec<String> = Vec::new();
    for v in views {
        for d in v.annots.shape.iter().flatten() {
            if let Dim::Named(id) = d {
                let s = id.to_string();
                if !dim_names.contains(&s) {
                    dim_names.push(s);
                }
            }
        }
    }
    let param_specs = views.iter().enumerate().map(|(i, v)| {
        let name = v.ident.unraw().to_string();
        let shape = match &v.annots.shape {
            None => quote!(::core::option::Option::None),
            Some(dims) => {
                let dims = dims.iter().map(|d| match d {
                    Dim::Fixed(n) => quote!(#rt::Dim::Fixed(#n)),
                    Dim::Any => quote!(#rt::Dim::Any),
                    Dim::Rest => quote!(#rt::Dim::Rest),
                    Dim::Named(id) => {
                        let k = dim_names.iter().position(|n| id == n).expect("collected") as u8;
                        quote!(#rt::Dim::Named(#k))
                    }
                });
                quote!(::core::option::Option::Some(&[#(#dims),*]))
            }
        };
        let devices = annot::devices_tokens(&rt, v.annots.devices.as_deref());
        let order = annot::order_tokens(&rt, v.annots.order);
        let convert = !(opts.noconvert || v.annots.noconvert || v.kind.writable());
        let tp = v.tparam.map(|k| &a.tparams[k]);
        let dtypes = match tp {
            Some(tp) if tp.decided_by == Some(i) => {
                let tys = tp.dtypes.iter().map(dtype_type);
                quote!(&[#(<#tys as #rt::Element>::DTYPE),*])
            }
            _ => quote!(&[]),
        };
        let shares = match tp {
            Some(tp) if tp.decided_by != Some(i) => {
                let (t, by) = (tp.ident.to_string(), tp.decided_by.expect("checked") as u8);
                quote!(::core::option::Option::Some(#rt::SharedDType { type_param: #t, decided_by: #by }))
            }
            _ => quote!(::core::option::Option::None),
        };
        quote!(#rt::ParamSpec {
            name: #name, shape: #shape, devices: #devices, order: #order,
            convert: #convert, dtypes: #dtypes, shares_dtype: #shares,
        })
    });
    // The Python name: errors and the signature line use it.
    let fn_name = pysig::scan_pyo3_attrs(attrs)
        .name
        .unwrap_or_else(|| sig.ident.unraw().to_string());
    let stream_setup =
        stream::setup_tokens(&rt, &fn_name, opts.stream.as_ref(), a.stream_param.as_ref());

    let peek_ident = |v: &ViewParam| {
        let i = views
            .iter()
            .position(|w| std::ptr::eq(w, v))
            .expect("a view of this function");
        format_ident!("__dlcast_peek{i}")
    };
    // The statement is located at the view type, so that an unsupported
    // element type is reported on the parameter, but resolves names at the
    // call site (a type from a `macro_rules` fragment has another hygiene
    // context, in which `__dlcast` would not be found).
    let prepares = views.iter().enumerate().map(|(i, v)| {
        let (ident, ty) = (&v.ident, &v.ty);
        let span = ty.span().resolved_at(Span::call_site());
        if v.optional {
            quote_spanned!(span=> __dlcast.prepare_opt::<#ty>(#i, #ident)?;)
        } else {
            quote_spanned!(span=> __dlcast.prepare::<#ty>(#i, #ident)?;)
        }
    });
    let takes = views.iter().enumerate().map(|(i, v)| {
        let (ident, ty) = (&v.ident, &v.ty);
        let span = ty.span().resolved_at(Span::call_site());
        if v.optional {
            quote_spanned!(span=> let #ident = __dlcast.take_opt::<#ty>(#i, #ident)?;)
        } else {
            quote_spanned!(span=> let #ident = __dlcast.take::<#ty>(#i, #ident)?;)
        }
    });

    // The user's function, unchanged but for the annotations, becomes the
    // body; the exported function takes Python objects.
    let (body_ident, body_path) = match ctx {
        Ctx::Free => {
            let id = format_ident!("__dlcast_body", span = Span::call_site());
            (id.clone(), quote!(#id))
        }
        Ctx::Method(_) => {
            let id = format_ident!("__dlcast_body_{}", sig.ident, span = Span::call_site());
            (id.clone(), quote!(Self::#id))
        }
    };
    let mut body_sig = sig.clone();
    body_sig.ident = body_ident;
    for arg in body_sig.inputs.iter_mut() {
        if let FnArg::Typed(pt) = arg {
            pt.attrs.clear();
        }
    }
    let body_fn = quote! {
        #[allow(clippy::too_many_arguments)]
        #[doc(hidden)]
        #body_sig #block
    };
    let call_args = &a.call_args;
    let body_call = if returns_result(&sig.output) {
        quote!(#body_path(#(#call_args),*)?)
    } else {
        quote!(#body_path(#(#call_args),*))
    };
    // `like(param)` reads the argument's framework before it is imported.
    let mut like_prelude = quote!();
    let framework = match &opts.returns {
        Some(Returns::Framework(v)) => quote!(::core::option::Option::Some(#rt::Framework::#v)),
        Some(Returns::Like(p)) => {
            let Some(v) = views.iter().find(|v| v.ident == *p) else {
                return Err(Error::new_spanned(
                    p,
                    format!("`like({p})` must name an array parameter of this function"),
                ));
            };
            like_prelude = if v.optional {
                quote!(let __dlcast_like = #p.and_then(#rt::Framework::of);)
            } else {
                quote!(let __dlcast_like = #rt::Framework::of(#p);)
            };
            quote!(__dlcast_like)
        }
        None => quote!(::core::option::Option::None),
    };
    // Special methods (`__iadd__`, `__contains__`, ...) and setters need the
    // body's own return type (PyO3 checks it) and no extra argument: they
    // return it as is, without `returns = ...`.
    let plain_return = matches!(ctx, Ctx::Method(_))
        && (has_attr(attrs, "setter")
            || (sig.ident.to_string().starts_with("__") && sig.ident.to_string().ends_with("__")));
    let result = if plain_return {
        quote!(::core::result::Result::Ok(#body_call))
    } else if returns_unit(&sig.output) {
        quote! {
            #body_call;
            ::core::result::Result::Ok(__dlcast_py.None())
        }
    } else {
        quote!(#rt::into_py_result(__dlcast_py, #body_call, #framework))
    };
    let run = quote! {
        #(#prepares)*
        __dlcast.finish()?;
        #(#takes)*
        let __dlcast_guard = __dlcast.body();
        #result
    };
    // A dtype-generic function: peek at each deciding argument, then one
    // match per type parameter; each arm names the type with a local alias
    // and runs the same imports, monomorphised.
    let peeks = a.tparams.iter().map(|tp| {
        let i = tp.decided_by.expect("checked");
        let (peek, ident) = (peek_ident(&views[i]), &views[i].ident);
        let writable = views[i].kind.writable();
        quote!(let #peek = __dlcast.peek(#i, #ident, #writable)?;)
    });
    let dispatch = dispatch_tokens(&a, 0, &mut Vec::new(), &run, &peek_ident);

    // Python-facing signature and docstring.
    let array_type = match &opts.returns {
        None => "dlcast.Array",
        Some(Returns::Like(_)) => "...",
        Some(Returns::Framework(v)) => match v.to_string().as_str() {
            "Numpy" => "numpy.ndarray",
            "Torch" => "torch.Tensor",
            "Jax" => "jax.Array",
            "Cupy" => "cupy.ndarray",
            "Tensorflow" => "tensorflow.Tensor",
            "Memoryview" => "memoryview",
            "Mlx" => "mlx.core.array",
            "Paddle" => "paddle.Tensor",
            _ => "array_api_strict.Array",
        },
    };
    let mut py_params = a.py_params.clone();
    for v in views {
        let dtype = match v.tparam {
            Some(k) => Some(
                a.tparams[k]
                    .dtypes
                    .iter()
                    .map(dtype_python_name)
                    .collect::<Vec<_>>()
                    .join(" | "),
            ),
            // An element type dlcast cannot name (an alias) shows as written.
            None => element_type(&v.ty).map(|t| {
                pysig::element_name(t)
                    .map(String::from)
                    .unwrap_or_else(|| t.to_token_stream().to_string().replace(' ', ""))
            }),
        };
        let ann =
            pysig::array_annotation(&v.annots, dtype, &dim_names, v.kind.writable(), v.optional);
        if let Some(p) = py_params.iter_mut().find(|(n, _)| v.ident.unraw() == n) {
            p.1 = Some(ann);
        }
    }
    let pyo3_attrs = pysig::scan_pyo3_attrs(attrs);
    let params_text = pysig::parameter_list(&py_params, pyo3_attrs.signature.as_ref());
    let receiver = if a.has_receiver {
        "self"
    } else if has_attr(attrs, "classmethod") {
        "cls"
    } else {
        ""
    };
    let params_text = match (receiver.is_empty(), params_text.is_empty()) {
        (true, _) => params_text,
        (false, true) => receiver.to_string(),
        (false, false) => format!("{receiver}, {params_text}"),
    };
    let ret = pysig::return_annotation(&sig.output, array_type, self_name(ctx))
        .unwrap_or_else(|| "...".into());
    // The first docstring line, as pybind11 and nanobind write it: help()
    // shows it, and the stub generator parses it. (`__text_signature__`
    // stays PyO3's, without annotations, which `inspect.signature` refuses.)
    let doc_line = format!(" {fn_name}({params_text}) -> {ret}");
    let has_doc = attrs.iter().any(|a| a.path().is_ident("doc"));
    let doc_sep = has_doc.then(|| quote!(#[doc = ""]));

    let mut outer_generics = sig.generics.clone();
    outer_generics.params = outer_generics
        .params
        .into_iter()
        .filter(|g| matches!(g, GenericParam::Lifetime(_)))
        .collect();
    if !a.tparams.is_empty() {
        outer_generics.where_clause = None;
    }
    let outer_params = &a.outer_params;
    let (fn_token, ident) = (&sig.fn_token, &sig.ident);
    let (nested_body, body) = match ctx {
        Ctx::Free => (body_fn, quote!()),
        Ctx::Method(_) => (quote!(), body_fn),
    };
    let spec_ident = format_ident!("__DLCAST_SPEC");
    let (py_param, ret_ty) = if plain_return {
        (quote!(), body_value_type(&sig.output))
    } else {
        (
            quote!(__dlcast_py: #pyo3::Python<'_>,),
            quote!(#pyo3::Py<#pyo3::PyAny>),
        )
    };
    let wrapper = quote! {
        #[doc = #doc_line]
        #doc_sep
        #(#attrs)*
        #[allow(clippy::too_many_arguments, clippy::needless_question_mark)]
        #vis #fn_token #ident #outer_generics(
            #(#outer_params,)*
            #py_param
        ) -> #pyo3::PyResult<#ret_ty> {
            #nested_body
            static #spec_ident: #rt::FnSpec = #rt::FnSpec {
                name: #fn_name,
                dim_names: &[#(#dim_names),*],
                params: &[#(#param_specs),*],
            };
            #like_prelude
            let mut __dlcast = #rt::CallCx::new(&#spec_ident);
            #stream_setup
            #(#peeks)*
            #dispatch
        }
    };
    Ok(Generated { wrapper, body })
}

/// The dispatch of a dtype-generic function: one `match` per type
/// parameter (from `k` on) over its listed dtypes; the innermost arms alias
/// each type parameter to the matched element type and run `run`.
fn dispatch_tokens(
    a: &Analysis,
    k: usize,
    aliases: &mut Vec<(Ident, Type)>,
    run: &TokenStream2,
    peek_ident: &dyn Fn(&ViewParam) -> Ident,
) -> TokenStream2 {
    let rt = quote!(::dlcast_runtime::__private);
    let Some(tp) = a.tparams.get(k) else {
        let aliases = aliases.iter().map(|(t, ty)| quote!(type #t = #ty;));
        return quote!({ #(#aliases)* #run });
    };
    let i = tp.decided_by.expect("checked");
    let peek = peek_ident(&a.views[i]);
    let arms = tp.dtypes.iter().map(|name| {
        let ty = dtype_type(name);
        aliases.push((tp.ident.clone(), ty.clone()));
        let inner = dispatch_tokens(a, k + 1, aliases, run, peek_ident);
        aliases.pop();
        quote!(__dlcast_d if __dlcast_d == <#ty as #rt::Element>::DTYPE => #inner)
    });
    quote! {
        match #peek.dtype() {
            #(#arms,)*
            _ => ::core::result::Result::Err(__dlcast.unlisted_dtype(#i, &#peek)),
        }
    }
}
