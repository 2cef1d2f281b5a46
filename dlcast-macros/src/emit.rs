//! Code generation: the exported function, its static `FnSpec`, and one
//! runtime call per step (`prepare`, `finish`, `take`, the body).

use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{Attribute, Block, Error, FnArg, GenericParam, Ident, Signature, Type, Visibility};

use crate::analyse::{analyze, Analysis, ViewParam};
use crate::annot::{self, Dim};
use crate::facts::DTYPES;
use crate::parse::{
    body_value_type, element_type, find_nd_view, has_attr, return_holds, returns_result,
    returns_unit, FnOptions, Holds, Returns, ViewKind,
};
use crate::{pysig, stream, stubhint};

/// Where the expanded function lives.
pub(crate) enum Ctx {
    /// A free `#[pyfunction]`: the body becomes a nested `fn`.
    Free,
    /// A method of a `#[pymethods]` block: the body becomes an associated
    /// function of a second, plain `impl` block (PyO3 would export every
    /// function of the `#[pymethods]` block). Holds the class's name.
    Method(String),
}

/// The class name `Self` stands for, in a method.
pub(crate) fn self_name(ctx: &Ctx) -> Option<&str> {
    match ctx {
        Ctx::Free => None,
        Ctx::Method(name) => Some(name),
    }
}

/// The Rust element type for a `#[dtype(..)]` name.
pub(crate) fn dtype_type(name: &Ident) -> Type {
    let path = DTYPES
        .iter()
        .find(|d| name == d.rust)
        .map(|d| d.element)
        .expect("checked by annot");
    let mut ty: Type = syn::parse_str(path).expect("valid type path");
    respan(&mut ty, name.span());
    ty
}

/// Gives every token of `ty` the span `span` (for errors at the name).
pub(crate) fn respan(ty: &mut Type, span: Span) {
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

/// The NumPy name shown for a `#[dtype(..)]` name.
pub(crate) fn dtype_python_name(name: &Ident) -> &'static str {
    DTYPES
        .iter()
        .find(|d| name == d.rust)
        .map(|d| d.name)
        .expect("checked by annot")
}

/// The code generated for one function or method.
pub(crate) struct Generated {
    /// The exported function (or method).
    pub(crate) wrapper: TokenStream2,
    /// For methods: the body, an associated function for the plain impl.
    pub(crate) body: TokenStream2,
    /// A class attribute that keeps what Python does not show: the
    /// `#[new]` line as `__init__` in `__dlcast_new__` (see
    /// [`pysig::init_line`]), a special method's line and doc comment in
    /// `__dlcast_<name>__` (see [`pysig::special_attr`]).
    pub(crate) class_attr: Option<(String, String)>,
    /// With the `inspect` feature: the marker types of the hints PyO3's
    /// introspection reads (items beside the function or `impl` block).
    pub(crate) hint_items: TokenStream2,
}

pub(crate) fn expand_callable(
    opts: &FnOptions,
    attrs: &[Attribute],
    vis: &Visibility,
    sig: &Signature,
    block: &Block,
    ctx: &Ctx,
    handle_annotations: &[(String, String)],
) -> syn::Result<Generated> {
    let rt = quote!(::dlcast_runtime::__private);
    let pyo3 = quote!(#rt::pyo3);
    let mut a = analyze(attrs, sig)?;
    crate::handle::annotate(&mut a.py_params, handle_annotations);
    let views = &a.views;
    if let syn::ReturnType::Type(_, ty) = &sig.output {
        if let Some(nd) = find_nd_view(ty) {
            return Err(Error::new_spanned(
                nd,
                "an ndarray view cannot be returned to Python: take the parameter as a \
                 `TensorRef<'_, T, N>` and return it (zero-copy), or return an owned \
                 `Tensor<T>` (`Tensor::from(x.to_owned())`)",
            ));
        }
    }

    // Named extents, numbered in order of first use.
    let mut dim_names: Vec<String> = Vec::new();
    for v in views {
        for d in v.shape.iter().flatten() {
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
        let shape = match &v.shape {
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
        // A slice is C-contiguous (for one dimension: contiguous).
        let order = match v.kind {
            ViewKind::Slice | ViewKind::SliceMut => Some(annot::Order::C),
            _ => v.annots.order,
        };
        // Types that hand out Rust references (slices, ndarray views, and the
        // slice accessors under `#[order]`) get aligned host memory.
        let aligned =
            v.kind.native() || matches!(v.kind, ViewKind::Ref | ViewKind::Mut) && order.is_some();
        let order = annot::order_tokens(&rt, order);
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
            convert: #convert, aligned: #aligned, dtypes: #dtypes, shares_dtype: #shares,
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
        let (ident, ty) = (&v.ident, &elide_lifetimes(&v.ty));
        let span = ty.span().resolved_at(Span::call_site());
        if v.optional {
            quote_spanned!(span=> __dlcast.prepare_opt::<#ty>(#i, #ident)?;)
        } else {
            quote_spanned!(span=> __dlcast.prepare::<#ty>(#i, #ident)?;)
        }
    });
    let takes = views.iter().enumerate().map(|(i, v)| {
        let (ident, ty) = (&v.ident, &elide_lifetimes(&v.ty));
        let span = ty.span().resolved_at(Span::call_site());
        if v.optional {
            quote_spanned!(span=> let #ident = __dlcast.take_opt::<#ty>(#i)?;)
        } else {
            quote_spanned!(span=> let #ident = __dlcast.take::<#ty>(#i)?;)
        }
    });

    // The user's function, unchanged but for the annotations, becomes the
    // body; the exported function takes Python objects.
    let body_ident = format_ident!("{}_rs", sig.ident.unraw());
    let body_path = match ctx {
        Ctx::Free => quote!(#body_ident),
        Ctx::Method(_) => quote!(Self::#body_ident),
    };
    let mut body_sig = sig.clone();
    body_sig.ident = body_ident;
    for arg in body_sig.inputs.iter_mut() {
        if let FnArg::Typed(pt) = arg {
            pt.attrs.clear();
        }
    }
    // The body keeps the function's documentation and `cfg`/lint attributes,
    // not PyO3's.
    let body_attrs = attrs.iter().filter(|a| {
        [
            "doc", "cfg", "cfg_attr", "allow", "expect", "warn", "deny", "inline",
        ]
        .iter()
        .any(|n| a.path().is_ident(n))
    });
    let body_doc = format!(
        " The Rust function behind the Python function `{fn_name}` (see `#[dlpack_fn]`), \
         callable from Rust with views over Rust data."
    );
    let body_fn = quote! {
        #[doc = #body_doc]
        #[doc = ""]
        #(#body_attrs)*
        #[allow(clippy::too_many_arguments, non_snake_case)]
        #vis #body_sig #block
    };
    let call_args = &a.call_args;
    // The body runs inside the call context's `body`, which holds back the
    // release of views dropped in it until it returns.
    // The views are taken inside it, as the body's arguments: each is built
    // where the body reads it, not moved into a closure first.
    let body_call = quote!(__dlcast.body(|| -> #rt::pyo3::PyResult<_> {
        #(#takes)*
        ::core::result::Result::Ok(#body_path(#(#call_args),*))
    })?);
    let body_call = if returns_result(&sig.output) {
        quote!(#body_call?)
    } else {
        body_call
    };
    // Special methods whose result Python's slot fixes (`__iadd__`,
    // `__contains__`, `__len__`, ...) and setters need the body's own return
    // type (PyO3 checks it) and no extra argument: they return it as is, and
    // `returns = ...` is refused on them. The ones that return any object
    // (`__call__`, `__getitem__`, the operators) are converted as any method.
    let special = matches!(ctx, Ctx::Method(_)) && is_dunder(&fn_name);
    let plain_return = matches!(ctx, Ctx::Method(_))
        && (has_attr(attrs, "setter") || special && !returns_any_object(&fn_name));
    if plain_return {
        if let Some(r) = opts.returns.as_ref().filter(|_| !opts.returns_inherited) {
            return Err(returns_on_fixed_result(r, &fn_name, sig));
        }
    }
    let holds = return_holds(&sig.output);
    // `like(param)` reads the argument's framework before it is imported;
    // so does the default, with the first array parameter (the first
    // required one if any).
    let like_of = |p: &Ident, optional: bool| {
        if optional {
            quote!(let __dlcast_like = #p.and_then(#rt::Framework::of);)
        } else {
            quote!(let __dlcast_like = #rt::Framework::of(#p);)
        }
    };
    let mut like_prelude = quote!();
    let framework = match &opts.returns {
        Some(Returns::Framework(f, span)) => {
            // The variant's name is the table's (`Debug` prints it).
            let v = Ident::new(&format!("{f:?}"), *span);
            quote!(::core::option::Option::Some(#rt::Framework::#v))
        }
        Some(Returns::Like(p)) => {
            let Some(v) = views.iter().find(|v| v.ident == *p) else {
                return Err(Error::new_spanned(
                    p,
                    format!("`like({p})` must name an array parameter of this function"),
                ));
            };
            like_prelude = like_of(p, v.optional);
            quote!(__dlcast_like)
        }
        Some(Returns::Dlcast) => quote!(::core::option::Option::None),
        None => match views.iter().find(|v| !v.optional).or(views.first()) {
            Some(v) if holds != Holds::NoArrays && !plain_return => {
                like_prelude = like_of(&v.ident, v.optional);
                quote!(__dlcast_like)
            }
            _ => quote!(::core::option::Option::None),
        },
    };
    if let Some(r) = opts.returns.as_ref().filter(|_| !opts.returns_inherited) {
        if holds == Holds::NoArrays && !plain_return {
            return Err(returns_without_arrays(r, sig));
        }
    }
    let result = if plain_return {
        quote!(::core::result::Result::Ok(#body_call))
    } else if returns_unit(&sig.output) {
        quote! {
            #body_call;
            ::core::result::Result::Ok(__dlcast_py.None())
        }
    } else {
        match &opts.returns {
            // No framework to convert to: PyO3's conversion itself (what
            // `into_py_result` does then), without the call.
            Some(Returns::Dlcast) => {
                quote!(#pyo3::IntoPyObjectExt::into_py_any(#body_call, __dlcast_py))
            }
            None if holds == Holds::NoArrays => {
                quote!(#pyo3::IntoPyObjectExt::into_py_any(#body_call, __dlcast_py))
            }
            // The default: like the first array argument, else NumPy.
            None => quote!(#rt::into_py_default(__dlcast_py, #body_call, #framework)),
            Some(_) => quote!(#rt::into_py_result(__dlcast_py, #body_call, #framework)),
        }
    };
    let run = quote! {
        #(#prepares)*
        __dlcast.finish()?;
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
    // What a returned array becomes: `like(x)` names the parameter whose
    // framework it takes (the stub generator reads it from here).
    let array_type = match &opts.returns {
        Some(Returns::Dlcast) => "dlcast.Array".to_string(),
        // The default: like the first (required) array parameter, else NumPy;
        // `like(x, numpy)`: an argument of no framework (a buffer, a capsule)
        // gets NumPy, where `returns = like(x)` keeps a `dlcast.Array` (the
        // stub generator types the two apart).
        None => match views.iter().find(|v| !v.optional).or(views.first()) {
            Some(v) => format!("like({}, numpy)", v.ident.unraw()),
            None => "numpy.ndarray".to_string(),
        },
        Some(Returns::Like(p)) => format!("like({})", p.unraw()),
        Some(Returns::Framework(f, _)) => f.facts().python_type.to_string(),
    };
    let mut py_params = a.py_params.clone();
    let mut view_hints = Vec::new();
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
        let ann = pysig::array_annotation(
            &v.annots,
            v.shape.as_deref(),
            dtype,
            &dim_names,
            v.kind.writable(),
            v.optional,
        );
        if let Some(p) = py_params.iter_mut().find(|(n, _)| v.ident.unraw() == n) {
            // PyO3's hint keeps the constraint text (without `| None`,
            // which PyO3 adds for an `Option`).
            view_hints.push(stubhint::param_hint(
                ann.strip_suffix(" | None").unwrap_or(&ann),
            ));
            p.1 = Some(ann);
        } else {
            view_hints.push(stubhint::param_hint("ndarray"));
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
    let new_line = has_attr(attrs, "new").then(|| pysig::init_line(&params_text));
    let params_text = pysig::with_receiver(receiver, &params_text);
    let ret = pysig::return_annotation(&sig.output, &array_type, self_name(ctx))
        .unwrap_or_else(|| "...".into());
    // The first docstring line, as pybind11 and nanobind write it: help()
    // shows it, and the stub generator parses it. (`__text_signature__`
    // stays PyO3's, without annotations, which `inspect.signature` refuses.)
    let doc_line = format!(" {fn_name}({params_text}) -> {ret}");
    // Python shows its own docstring for a special method (a slot): the
    // line, and the doc comment, are kept in a class attribute.
    let class_attr = match new_line {
        Some(line) => Some(("__dlcast_new__".to_string(), line)),
        None if special && keeps_line(&fn_name) => {
            Some(pysig::special_attr(&fn_name, &doc_line, attrs))
        }
        None => None,
    };
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
    let (fn_token, ident) = (&sig.fn_token, &sig.ident);
    let spec_ident = format_ident!("__DLCAST_SPEC");
    let n_views = views.len();
    let (py_param, ret_ty) = if plain_return {
        (quote!(), body_value_type(&sig.output))
    } else {
        (
            quote!(__dlcast_py: #pyo3::Python<'_>,),
            quote!(#pyo3::Py<#pyo3::PyAny>),
        )
    };
    // The straight-line call (see the runtime's `FastCx`), for functions
    // whose array parameters are all required and of one element type each,
    // read from the producer's stream: tried first; where it does not take
    // the call, the general path runs it from the start. The same body code,
    // with `__dlcast` naming the straight-line call.
    let fast = if !views.is_empty()
        && a.tparams.is_empty()
        && views.iter().all(|v| !v.optional)
        && opts.stream.is_none()
        && a.stream_param.is_none()
    {
        let args = views.iter().map(|v| {
            let (ident, ty) = (&v.ident, &elide_lifetimes(&v.ty));
            let span = ty.span().resolved_at(Span::call_site());
            quote_spanned!(span=> #rt::FastArg::of::<#ty>(#ident))
        });
        quote! {
            if let ::core::option::Option::Some(__dlcast) =
                #rt::FastCx::<#n_views>::read(&#spec_ident, [#(#args),*])
            {
                let __dlcast = &__dlcast;
                return { #result };
            }
        }
    } else {
        quote!()
    };
    // Without array parameters (nor a stream to set up): no call context.
    let general = if views.is_empty() && opts.stream.is_none() && a.stream_param.is_none() {
        quote! {
            let __dlcast = &#rt::FastCx::<0>::no_arrays(&#spec_ident)?;
            #result
        }
    } else {
        quote! {
            let mut __dlcast = #rt::CallCx::<#n_views>::new(&#spec_ident);
            #stream_setup
            #(#peeks)*
            #dispatch
        }
    };
    // With the `inspect` feature: the hints PyO3's introspection reads.
    let marker_base = match ctx {
        Ctx::Free => format!("Fn_{}", sig.ident.unraw()),
        Ctx::Method(class) => format!("Method_{class}__{}", sig.ident.unraw()),
    };
    let hints = stubhint::Inspect::new(
        &marker_base,
        views,
        &view_hints,
        a.outer_params.clone(),
        (!plain_return).then_some(ret.as_str()),
    );
    let (outer_params, hint_items, unwrap_args) =
        (hints.outer_params, hints.items, hints.unwrap_args);
    let wrap_result = hints.ret_ty.is_some();
    let ret_ty = hints.ret_ty.unwrap_or(ret_ty);
    let mut inner = quote! {
        #like_prelude
        #fast
        #general
    };
    if wrap_result {
        // The body's `return`s leave the closure; its result is wrapped.
        inner = quote! {
            ::core::result::Result::map(
                (|| -> #pyo3::PyResult<#pyo3::Py<#pyo3::PyAny>> { #inner })(),
                #rt::Out::new,
            )
        };
    }
    let wrapper = quote! {
        #[doc = #doc_line]
        #doc_sep
        #(#attrs)*
        #[allow(clippy::too_many_arguments, clippy::needless_question_mark)]
        #vis #fn_token #ident #outer_generics(
            #(#outer_params,)*
            #py_param
        ) -> #pyo3::PyResult<#ret_ty> {
            static #spec_ident: #rt::FnSpec = #rt::FnSpec {
                name: #fn_name,
                dim_names: &[#(#dim_names),*],
                params: &[#(#param_specs),*],
            };
            #unwrap_args
            #inner
        }
    };
    Ok(Generated {
        wrapper,
        body: body_fn,
        class_attr,
        hint_items,
    })
}

/// Whether `name` is spelled as a special method's (`__call__`).
pub(crate) fn is_dunder(name: &str) -> bool {
    name.len() > 4 && name.starts_with("__") && name.ends_with("__")
}

/// Whether a special method's signature line says what Python sees: not for
/// in-place operators (Python gets `self` back, whatever the body returns),
/// iterator steps (an `Option` ends the iteration) and PyO3's hooks.
pub(crate) fn keeps_line(name: &str) -> bool {
    let bare = &name[2..name.len() - 2];
    let in_place = bare.starts_with('i')
        && !["int", "index", "iter", "init", "invert"].contains(&bare)
        || bare.starts_with("inplace_");
    !in_place
        && ![
            "next",
            "anext",
            "iter",
            "aiter",
            "await",
            "traverse",
            "clear",
            "getbuffer",
            "releasebuffer",
            "init",
            "new",
        ]
        .contains(&bare)
}

/// The special methods whose result PyO3 converts as any method's (its
/// slot returns any object), so that dlcast converts it too: the default
/// framework, `returns = ..`, a typed signature line.
fn returns_any_object(name: &str) -> bool {
    const BINARY: &[&str] = &[
        "add", "sub", "mul", "matmul", "truediv", "floordiv", "mod", "divmod", "pow", "lshift",
        "rshift", "and", "xor", "or",
    ];
    let bare = &name[2..name.len() - 2];
    matches!(
        bare,
        "call"
            | "getitem"
            | "pos"
            | "neg"
            | "abs"
            | "invert"
            | "lt"
            | "le"
            | "eq"
            | "ne"
            | "gt"
            | "ge"
            | "richcmp"
    ) || BINARY.contains(&bare)
        || bare.strip_prefix('r').is_some_and(|b| BINARY.contains(&b))
}

/// The error for `returns = ..` on a special method whose result Python's
/// slot fixes (or a setter): PyO3 passes it on as it is.
fn returns_on_fixed_result(r: &Returns, name: &str, sig: &Signature) -> Error {
    let span = match r {
        Returns::Framework(_, span) => *span,
        Returns::Like(p) => p.span(),
        Returns::Dlcast => sig.ident.span(),
    };
    Error::new(
        span,
        format!(
            "`returns` does not apply to `{name}`: PyO3 hands its result to Python as it \
             is (a setter, or a special method whose result type Python fixes); drop \
             `returns` here (`__call__`, `__getitem__` and the operators take it)"
        ),
    )
}

/// The dispatch of a dtype-generic function: one `match` per type
/// parameter (from `k` on) over its listed dtypes; the innermost arms alias
/// each type parameter to the matched element type and run `run`.
pub(crate) fn dispatch_tokens(
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

/// `ty` with every lifetime written `'_`: the view borrows the call
/// context, whatever lifetime the body names it with (a lifetime parameter
/// of the function would outlive the context).
fn elide_lifetimes(ty: &Type) -> Type {
    fn walk(tokens: TokenStream2) -> TokenStream2 {
        let mut out = Vec::new();
        let mut after_quote = false;
        for t in tokens {
            let t = match t {
                proc_macro2::TokenTree::Group(g) => {
                    let mut n = proc_macro2::Group::new(g.delimiter(), walk(g.stream()));
                    n.set_span(g.span());
                    proc_macro2::TokenTree::Group(n)
                }
                proc_macro2::TokenTree::Ident(i) if after_quote => {
                    proc_macro2::TokenTree::Ident(Ident::new("_", i.span()))
                }
                other => other,
            };
            after_quote = matches!(&t, proc_macro2::TokenTree::Punct(p) if p.as_char() == '\'');
            out.push(t);
        }
        out.into_iter().collect()
    }
    syn::parse2(walk(ty.to_token_stream())).unwrap_or_else(|_| ty.clone())
}

/// The error for `returns = ..` on a function whose return type holds no
/// dlcast array: PyO3 would turn the value into a list or a number, and
/// the option would be ignored.
fn returns_without_arrays(r: &Returns, sig: &Signature) -> Error {
    let option = match r {
        Returns::Framework(f, _) => f.facts().option.to_string(),
        Returns::Like(p) => format!("like({p})"),
        Returns::Dlcast => "dlcast".into(),
    };
    let msg = |what: &str| {
        format!(
            "`returns = {option}` hands the dlcast arrays a function returns to a framework, \
             but {what}: return a `Tensor<T>` (e.g. `Tensor::from(vec)`) or a view of an \
             argument, or drop `returns`"
        )
    };
    match &sig.output {
        syn::ReturnType::Default => Error::new_spanned(&sig.ident, msg("this one returns nothing")),
        syn::ReturnType::Type(_, ty) => {
            let shown = [
                ("& ", "&"),
                (" <", "<"),
                ("< ", "<"),
                (" >", ">"),
                ("[ ", "["),
            ]
            .iter()
            .chain(&[(" ]", "]"), (" ,", ","), (" ;", ";")])
            .fold(ty.to_token_stream().to_string(), |s, (a, b)| {
                s.replace(a, b)
            });
            Error::new_spanned(
                ty,
                msg(&format!(
                    "`{shown}` holds none (PyO3 makes a number, string or list of it)"
                )),
            )
        }
    }
}
