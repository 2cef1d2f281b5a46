//! The `#[dlpack_fn]` attribute macro. Use it through `dlcast_runtime`,
//! which re-exports it and does all the work at run time; this crate only
//! parses, checks the annotations with precise spans, and emits one static
//! description of the constraints plus one runtime call per parameter.

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{
    parse_macro_input, Error, FnArg, GenericArgument, Ident, ItemFn, Pat, PathArguments,
    ReturnType, Type,
};

mod annot;
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
/// `#[dlpack_fn(returns = numpy)]` (or `torch`, `jax`, `cupy`, `tensorflow`,
/// `array_api`) hands every returned array to that framework instead.
///
/// Place it above `#[pyfunction]`.
#[proc_macro_attribute]
pub fn dlpack_fn(attr: TokenStream, item: TokenStream) -> TokenStream {
    let opts = match parse_options(attr.into()) {
        Ok(o) => o,
        Err(e) => return e.to_compile_error().into(),
    };
    let func = parse_macro_input!(item as ItemFn);
    expand(opts, func)
        .unwrap_or_else(|e| e.to_compile_error())
        .into()
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
        let Type::Path(p) = ty else { return None };
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
    let Type::Path(p) = ty else { return None };
    let last = p.path.segments.last()?;
    if last.ident != "Option" {
        return None;
    }
    match &last.arguments {
        PathArguments::AngleBracketed(a) if a.args.len() == 1 => match &a.args[0] {
            GenericArgument::Type(t) => Some(t),
            _ => None,
        },
        _ => None,
    }
}

/// An error for a view type spelled with a lifetime other than `'_` (only
/// `'static` can be named, since generics are refused): the view must not
/// outlive the call, and the body's signature is what enforces that.
fn named_lifetime(view: &Type) -> Option<Error> {
    let Type::Path(p) = view else { return None };
    let PathArguments::AngleBracketed(a) = &p.path.segments.last()?.arguments else {
        return None;
    };
    a.args.iter().find_map(|g| match g {
        GenericArgument::Lifetime(l) if l.ident != "_" => Some(Error::new_spanned(
            l,
            format!(
                "a view borrows its Python argument for the call only; \
                 write `'_` instead of `{l}`"
            ),
        )),
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
];

/// `returns = ...` of `#[dlpack_fn(...)]`.
enum Returns {
    /// A framework: the runtime's `Framework` variant.
    Framework(Ident),
    /// `like(param)`: the framework of that argument, decided per call.
    Like(Ident),
}

/// Options of `#[dlpack_fn(...)]`.
#[derive(Default)]
struct FnOptions {
    returns: Option<Returns>,
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
        } else if meta.path.is_ident("stream") {
            stream::parse_option(&meta, &mut opts.stream)
        } else {
            Err(meta.error(
                "unknown #[dlpack_fn] option; expected `returns = <framework>`, \
                 `returns = like(<parameter>)` or `stream = <stream>`",
            ))
        }
    });
    syn::parse::Parser::parse2(parser, attr)?;
    Ok(opts)
}

fn expand(opts: FnOptions, mut func: ItemFn) -> syn::Result<TokenStream2> {
    let rt = quote!(::dlcast_runtime::__private);
    let pyo3 = quote!(#rt::pyo3);
    if let Some(g) = func.sig.generics.params.first() {
        return Err(Error::new_spanned(
            g,
            "#[dlpack_fn] functions cannot be generic yet",
        ));
    }

    let mut views: Vec<ViewParam> = Vec::new();
    let mut outer_params = Vec::new();
    let mut call_args = Vec::new();
    let mut stream_param: Option<stream::StreamParam> = None;
    let mut errors: Option<Error> = None;
    let mut push_err = |e: Error| match &mut errors {
        Some(all) => all.combine(e),
        None => errors = Some(e),
    };
    for arg in func.sig.inputs.iter_mut() {
        let FnArg::Typed(pt) = arg else {
            return Err(Error::new_spanned(
                arg,
                "#[dlpack_fn] does not support methods yet",
            ));
        };
        let stream_attr = match stream::take_attr(&mut pt.attrs) {
            Ok(a) => a,
            Err(e) => {
                push_err(e);
                continue;
            }
        };
        let annots = match annot::take(&mut pt.attrs) {
            Ok(a) => a,
            Err(e) => {
                push_err(e);
                continue;
            }
        };
        let (optional, inner) = match option_inner(&pt.ty) {
            Some(t) => (true, t),
            None => (false, &*pt.ty),
        };
        let Some(kind) = ViewKind::of(inner) else {
            if let Some(attr) = &annots.first {
                push_err(Error::new_spanned(
                    attr,
                    "#[shape], #[device] and #[order] apply to array parameters only \
                     (TensorRef, TensorMut, TensorDyn, TensorDynMut, or an Option of one)",
                ));
                continue;
            }
            if let Some(attr) = stream_attr {
                if let Err(e) = stream::record(&mut stream_param, attr, pt) {
                    push_err(e);
                    continue;
                }
            }
            outer_params.push(quote!(#pt));
            let pat = &pt.pat;
            call_args.push(quote!(#pat));
            continue;
        };
        if let Some(attr) = &stream_attr {
            push_err(stream::on_view_error(attr));
            continue;
        }
        if let Some(e) = named_lifetime(inner) {
            push_err(e);
            continue;
        }
        let Pat::Ident(pi) = &*pt.pat else {
            push_err(Error::new_spanned(
                &pt.pat,
                "an array parameter needs a plain name, e.g. `x: TensorRef<'_, f32>`",
            ));
            continue;
        };
        let ident = pi.ident.clone();
        let attrs = &pt.attrs;
        outer_params.push(if optional {
            quote!(#(#attrs)* #ident: ::core::option::Option<&#pyo3::Bound<'_, #pyo3::PyAny>>)
        } else {
            quote!(#(#attrs)* #ident: &#pyo3::Bound<'_, #pyo3::PyAny>)
        });
        call_args.push(quote!(#ident));
        views.push(ViewParam {
            ident,
            ty: inner.clone(),
            optional,
            kind,
            annots,
        });
    }
    if let Some(e) = errors {
        return Err(e);
    }

    // Named extents, numbered in order of first use.
    let mut dim_names: Vec<String> = Vec::new();
    let param_specs = views
        .iter()
        .map(|v| {
            let name = v.ident.to_string();
            let shape = match &v.annots.shape {
                None => quote!(::core::option::Option::None),
                Some(dims) => {
                    let dims = dims.iter().map(|d| match d {
                        Dim::Fixed(n) => quote!(#rt::Dim::Fixed(#n)),
                        Dim::Any => quote!(#rt::Dim::Any),
                        Dim::Rest => quote!(#rt::Dim::Rest),
                        Dim::Named(id) => {
                            let s = id.to_string();
                            let k = dim_names.iter().position(|n| *n == s).unwrap_or_else(|| {
                                dim_names.push(s);
                                dim_names.len() - 1
                            }) as u8;
                            quote!(#rt::Dim::Named(#k))
                        }
                    });
                    quote!(::core::option::Option::Some(&[#(#dims),*]))
                }
            };
            let devices = annot::devices_tokens(&rt, v.annots.devices.as_deref());
            let order = annot::order_tokens(&rt, v.annots.order);
            quote!(#rt::ParamSpec { name: #name, shape: #shape, devices: #devices, order: #order })
        })
        .collect::<Vec<_>>();
    let fn_name = func.sig.ident.to_string();
    let stream_setup =
        stream::setup_tokens(&rt, &fn_name, opts.stream.as_ref(), stream_param.as_ref());
    let has_writable = views.iter().any(|v| v.kind.writable());

    let imports = views.iter().enumerate().map(|(i, v)| {
        let (ident, ty) = (&v.ident, &v.ty);
        let method = if v.optional {
            quote!(opt_arg)
        } else {
            quote!(arg)
        };
        quote_spanned!(ty.span()=> let #ident = __dlcast.#method::<#ty>(#i, #ident)?;)
    });

    // The user's function, unchanged but for the annotations, becomes the
    // body; the exported function takes Python objects.
    let body_ident = format_ident!("__dlcast_body", span = Span::call_site());
    let mut body_fn = func.clone();
    body_fn.sig.ident = body_ident.clone();
    body_fn.attrs.clear();
    body_fn.vis = syn::Visibility::Inherited;
    for arg in body_fn.sig.inputs.iter_mut() {
        if let FnArg::Typed(pt) = arg {
            pt.attrs.clear();
        }
    }
    let body_call = if returns_result(&func.sig.output) {
        quote!(#body_ident(#(#call_args),*)?)
    } else {
        quote!(#body_ident(#(#call_args),*))
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
    let result = if returns_unit(&func.sig.output) {
        quote! {
            #body_call;
            ::core::result::Result::Ok(__dlcast_py.None())
        }
    } else {
        quote!(#rt::into_py_result(__dlcast_py, #body_call, #framework))
    };

    let ItemFn {
        attrs, vis, sig, ..
    } = &func;
    let (fn_token, ident) = (&sig.fn_token, &sig.ident);
    Ok(quote! {
        #(#attrs)*
        #[allow(clippy::too_many_arguments)]
        #vis #fn_token #ident(
            __dlcast_py: #pyo3::Python<'_>,
            #(#outer_params),*
        ) -> #pyo3::PyResult<#pyo3::Py<#pyo3::PyAny>> {
            #[allow(clippy::too_many_arguments)]
            #body_fn
            static __DLCAST_SPEC: #rt::FnSpec = #rt::FnSpec {
                name: #fn_name,
                dim_names: &[#(#dim_names),*],
                params: &[#(#param_specs),*],
                has_writable: #has_writable,
            };
            #like_prelude
            let mut __dlcast = #rt::CallCx::new(&__DLCAST_SPEC);
            #stream_setup
            #(#imports)*
            __dlcast.finish()?;
            #result
        }
    })
}
