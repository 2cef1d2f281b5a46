//! Code generation: the exported function, its static `FnSpec`, and one
//! runtime call per step (`prepare`, `finish`, `take`, the body).

use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{Attribute, Block, Error, FnArg, GenericParam, Ident, Signature, Type, Visibility};

use crate::analyse::{analyze, Analysis, ViewParam};
use crate::annot;
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

/// The paths the generated code names dlcast's runtime and PyO3 by.
fn runtime_paths() -> (TokenStream2, TokenStream2) {
    let rt = quote!(::dlcast_runtime::__private);
    let pyo3 = quote!(#rt::pyo3);
    (rt, pyo3)
}

/// One function or method being expanded, and what is decided about it once
/// (its analysis, Python name and the kind of result it hands back), for the
/// parts of the template below to read.
struct Callable<'a> {
    opts: &'a FnOptions,
    attrs: &'a [Attribute],
    sig: &'a Signature,
    ctx: &'a Ctx,
    vis: &'a Visibility,
    a: Analysis,
    /// Named extents, numbered in order of first use.
    dim_names: Vec<String>,
    /// The Python name: errors and the signature line use it.
    fn_name: String,
    /// A special method (`__call__`, `__len__`, ...).
    special: bool,
    /// The body's result goes to PyO3 as it is (see [`Callable::new`]).
    plain_return: bool,
    holds: Holds,
}

/// The code for one function or method: checks the options against it,
/// then assembles the template's parts (below) in the order they run.
pub(crate) fn expand_callable(
    opts: &FnOptions,
    attrs: &[Attribute],
    vis: &Visibility,
    sig: &Signature,
    block: &Block,
    ctx: &Ctx,
    handle_annotations: &[(String, String)],
) -> syn::Result<Generated> {
    let mut a = analyze(attrs, sig)?;
    crate::handle::annotate(&mut a.py_params, handle_annotations);
    refuse_returned_nd_view(sig)?;
    let c = Callable::new(opts, attrs, vis, sig, ctx, a);
    if c.plain_return {
        if let Some(r) = opts.returns.as_ref().filter(|_| !opts.returns_inherited) {
            return Err(returns_on_fixed_result(r, &c.fn_name, sig));
        }
    }

    let (like_prelude, framework) = c.return_framework()?;
    if let Some(r) = opts.returns.as_ref().filter(|_| !opts.returns_inherited) {
        if c.holds == Holds::NoArrays && !c.plain_return {
            return Err(returns_without_arrays(r, sig));
        }
    }

    let result = c.result_conversion(&framework);
    let line = c.signature_line();
    let (fast, general) = (c.fast_call(&result), c.general_call(&result));
    let calls = quote! {
        #like_prelude
        #fast
        #general
    };
    let (wrapper, hint_items) = c.wrapper(calls, &line);
    Ok(Generated {
        wrapper,
        body: c.body_fn(block),
        class_attr: line.class_attr,
        hint_items,
    })
}

/// An ndarray view borrows the call context, which ends with the call: the
/// error for one in the return type.
fn refuse_returned_nd_view(sig: &Signature) -> syn::Result<()> {
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
    Ok(())
}

/// The Python-facing text of one function: its signature line (the first
/// docstring line), return annotation, the views' introspection hints and
/// the class attribute that keeps what Python does not show.
struct SignatureLine {
    doc_line: String,
    ret: String,
    view_hints: Vec<stubhint::Py>,
    class_attr: Option<(String, String)>,
}

impl<'a> Callable<'a> {
    /// Decides what every part reads. Special methods whose result Python's
    /// slot fixes (`__iadd__`, `__contains__`, `__len__`, ...) and setters
    /// need the body's own return type (PyO3 checks it) and no extra
    /// argument: they return it as is, and `returns = ...` is refused on
    /// them. The ones that return any object (`__call__`, `__getitem__`, the
    /// operators) are converted as any method.
    fn new(
        opts: &'a FnOptions,
        attrs: &'a [Attribute],
        vis: &'a Visibility,
        sig: &'a Signature,
        ctx: &'a Ctx,
        a: Analysis,
    ) -> Self {
        let fn_name = pysig::scan_pyo3_attrs(attrs)
            .name
            .unwrap_or_else(|| sig.ident.unraw().to_string());
        let special = matches!(ctx, Ctx::Method(_)) && is_dunder(&fn_name);
        let plain_return = matches!(ctx, Ctx::Method(_))
            && (has_attr(attrs, "setter") || special && !returns_any_object(&fn_name));
        let dim_names = annot::dim_names(a.views.iter().flat_map(|v| v.shape.iter().flatten()));
        Callable {
            opts,
            attrs,
            sig,
            ctx,
            vis,
            a,
            dim_names,
            fn_name,
            special,
            plain_return,
            holds: return_holds(&sig.output),
        }
    }

    /// The runtime's description of each array parameter, in the static
    /// `FnSpec` the checks read.
    fn param_specs(&self) -> Vec<TokenStream2> {
        let (rt, _) = runtime_paths();
        let views = &self.a.views;
        let specs = views.iter().enumerate().map(|(i, v)| {
            let name = v.ident.unraw().to_string();
            let shape = annot::shape_tokens(&rt, v.shape.as_deref(), &self.dim_names);
            let devices = annot::devices_tokens(&rt, v.annots.devices.as_deref());
            // A slice is C-contiguous (for one dimension: contiguous).
            let order = match v.kind {
                ViewKind::Slice | ViewKind::SliceMut => Some(annot::Order::C),
                _ => v.annots.order,
            };
            // Types that hand out Rust references (slices, ndarray views, and
            // the slice accessors under `#[order]`) get aligned host memory.
            let aligned = v.kind.native()
                || matches!(v.kind, ViewKind::Ref | ViewKind::Mut) && order.is_some();
            let order = annot::order_tokens(&rt, order);
            let convert = !(self.opts.noconvert || v.annots.noconvert || v.kind.writable());
            let tp = v.tparam.map(|k| &self.a.tparams[k]);
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
        specs.collect()
    }

    /// The name of the body function: the user's, with `_rs` appended.
    fn body_ident(&self) -> Ident {
        format_ident!("{}_rs", self.sig.ident.unraw())
    }

    /// The user's function, unchanged but for the annotations, becomes the
    /// body; the exported function takes Python objects.
    fn body_fn(&self, block: &Block) -> TokenStream2 {
        let mut body_sig = self.sig.clone();
        body_sig.ident = self.body_ident();
        for arg in body_sig.inputs.iter_mut() {
            if let FnArg::Typed(pt) = arg {
                pt.attrs.clear();
            }
        }
        // The body keeps the function's documentation and `cfg`/lint
        // attributes, not PyO3's.
        let body_attrs = self.attrs.iter().filter(|a| {
            [
                "doc", "cfg", "cfg_attr", "allow", "expect", "warn", "deny", "inline",
            ]
            .iter()
            .any(|n| a.path().is_ident(n))
        });
        let vis = self.vis;
        let body_doc = format!(
            " The Rust function behind the Python function `{}` (see `#[dlpack_fn]`), \
             callable from Rust with views over Rust data.",
            self.fn_name
        );
        quote! {
            #[doc = #body_doc]
            #[doc = ""]
            #(#body_attrs)*
            #[allow(clippy::too_many_arguments, non_snake_case)]
            #vis #body_sig #block
        }
    }

    /// The call of the body. It runs inside the call context's `body`, which
    /// holds back the release of views dropped in it until it returns. The
    /// views are taken inside it, as the body's arguments: each is built
    /// where the body reads it, not moved into a closure first.
    fn body_call(&self) -> TokenStream2 {
        let (rt, _) = runtime_paths();
        let takes = self.a.views.iter().enumerate().map(|(i, v)| {
            let (ident, ty) = (&v.ident, &elide_lifetimes(&v.ty));
            let span = ty.span().resolved_at(Span::call_site());
            if v.optional {
                quote_spanned!(span=> let #ident = __dlcast.take_opt::<#ty>(#i)?;)
            } else {
                quote_spanned!(span=> let #ident = __dlcast.take::<#ty>(#i)?;)
            }
        });
        let body_ident = self.body_ident();
        let body_path = match self.ctx {
            Ctx::Free => quote!(#body_ident),
            Ctx::Method(_) => quote!(Self::#body_ident),
        };
        let call_args = &self.a.call_args;
        let body_call = quote!(__dlcast.body(|| -> #rt::pyo3::PyResult<_> {
            #(#takes)*
            ::core::result::Result::Ok(#body_path(#(#call_args),*))
        })?);
        if returns_result(&self.sig.output) {
            quote!(#body_call?)
        } else {
            body_call
        }
    }

    /// The framework a returned array goes to, and the statement that reads
    /// it from an argument where it depends on one. `like(param)` reads the
    /// argument's framework before it is imported; so does the default, with
    /// the first array parameter (the first required one if any).
    fn return_framework(&self) -> syn::Result<(TokenStream2, TokenStream2)> {
        let (rt, _) = runtime_paths();
        let views = &self.a.views;
        let like_of = |p: &Ident, optional: bool| {
            if optional {
                quote!(let __dlcast_like = #p.and_then(#rt::Framework::of);)
            } else {
                quote!(let __dlcast_like = #rt::Framework::of(#p);)
            }
        };
        let none = quote!(::core::option::Option::None);
        Ok(match &self.opts.returns {
            Some(Returns::Framework(f, span)) => {
                // The variant's name is the table's (`Debug` prints it).
                let v = Ident::new(&format!("{f:?}"), *span);
                (
                    quote!(),
                    quote!(::core::option::Option::Some(#rt::Framework::#v)),
                )
            }
            Some(Returns::Like(p)) => {
                let Some(v) = views.iter().find(|v| v.ident == *p) else {
                    return Err(Error::new_spanned(
                        p,
                        format!("`like({p})` must name an array parameter of this function"),
                    ));
                };
                (like_of(p, v.optional), quote!(__dlcast_like))
            }
            Some(Returns::Dlcast) => (quote!(), none),
            None => match views.iter().find(|v| !v.optional).or(views.first()) {
                Some(v) if self.holds != Holds::NoArrays && !self.plain_return => {
                    (like_of(&v.ident, v.optional), quote!(__dlcast_like))
                }
                _ => (quote!(), none),
            },
        })
    }

    /// The body's call and the conversion of its result into what the
    /// exported function returns.
    fn result_conversion(&self, framework: &TokenStream2) -> TokenStream2 {
        let (rt, pyo3) = runtime_paths();
        let body_call = self.body_call();
        if self.plain_return {
            return quote!(::core::result::Result::Ok(#body_call));
        }
        if returns_unit(&self.sig.output) {
            return quote! {
                #body_call;
                ::core::result::Result::Ok(__dlcast_py.None())
            };
        }
        match &self.opts.returns {
            // No framework to convert to: PyO3's conversion itself (what
            // `into_py_result` does then), without the call.
            Some(Returns::Dlcast) => {
                quote!(#pyo3::IntoPyObjectExt::into_py_any(#body_call, __dlcast_py))
            }
            None if self.holds == Holds::NoArrays => {
                quote!(#pyo3::IntoPyObjectExt::into_py_any(#body_call, __dlcast_py))
            }
            // The default: like the first array argument, else NumPy.
            None => quote!(#rt::into_py_default(__dlcast_py, #body_call, #framework)),
            Some(_) => quote!(#rt::into_py_result(__dlcast_py, #body_call, #framework)),
        }
    }

    /// Whether the straight-line call applies: the function's array
    /// parameters are all required and of one element type each, read from
    /// the producer's stream.
    fn takes_fast_call(&self) -> bool {
        let views = &self.a.views;
        !views.is_empty()
            && self.a.tparams.is_empty()
            && views.iter().all(|v| !v.optional)
            && self.opts.stream.is_none()
            && self.a.stream_param.is_none()
    }

    /// The straight-line call (see the runtime's `FastCallContext`), tried first;
    /// where it does not take the call, the general path runs it from the
    /// start. The same body code, with `__dlcast` naming the straight-line
    /// call.
    fn fast_call(&self, result: &TokenStream2) -> TokenStream2 {
        if !self.takes_fast_call() {
            return quote!();
        }
        let (rt, _) = runtime_paths();
        let spec_ident = format_ident!("__DLCAST_SPEC");
        let n_views = self.a.views.len();
        let args = self.a.views.iter().map(|v| {
            let (ident, ty) = (&v.ident, &elide_lifetimes(&v.ty));
            let span = ty.span().resolved_at(Span::call_site());
            quote_spanned!(span=> #rt::FastArg::of::<#ty>(#ident))
        });
        quote! {
            if let ::core::option::Option::Some(__dlcast) =
                #rt::FastCallContext::<#n_views>::read(&#spec_ident, [#(#args),*])
            {
                let __dlcast = &__dlcast;
                return { #result };
            }
        }
    }

    /// The general call: a call context, the stream set-up, each array
    /// imported (`prepare`), then checked together (`finish`) before the
    /// body runs. Without array parameters (nor a stream to set up): no
    /// call context.
    fn general_call(&self, result: &TokenStream2) -> TokenStream2 {
        let (rt, _) = runtime_paths();
        let (opts, a) = (self.opts, &self.a);
        let spec_ident = format_ident!("__DLCAST_SPEC");
        if a.views.is_empty() && opts.stream.is_none() && a.stream_param.is_none() {
            return quote! {
                let __dlcast = &#rt::FastCallContext::<0>::no_arrays(&#spec_ident)?;
                #result
            };
        }
        let stream_setup = stream::setup_tokens(
            &rt,
            &self.fn_name,
            opts.stream.as_ref(),
            a.stream_param.as_ref(),
        );
        // The statement is located at the view type, so that an unsupported
        // element type is reported on the parameter, but resolves names at
        // the call site (a type from a `macro_rules` fragment has another
        // hygiene context, in which `__dlcast` would not be found).
        let prepares = a.views.iter().enumerate().map(|(i, v)| {
            let (ident, ty) = (&v.ident, &elide_lifetimes(&v.ty));
            let span = ty.span().resolved_at(Span::call_site());
            if v.optional {
                quote_spanned!(span=> __dlcast.prepare_opt::<#ty>(#i, #ident)?;)
            } else {
                quote_spanned!(span=> __dlcast.prepare::<#ty>(#i, #ident)?;)
            }
        });
        let run = quote! {
            #(#prepares)*
            __dlcast.finish()?;
            #result
        };
        let n_views = a.views.len();
        let (peeks, dispatch) = self.dtype_dispatch(&run);
        quote! {
            let mut __dlcast = #rt::CallContext::<#n_views>::new(&#spec_ident);
            #stream_setup
            #(#peeks)*
            #dispatch
        }
    }

    /// A dtype-generic function: peek at each deciding argument, then one
    /// match per type parameter; each arm names the type with a local alias
    /// and runs the same imports, monomorphised.
    fn dtype_dispatch(&self, run: &TokenStream2) -> (Vec<TokenStream2>, TokenStream2) {
        let views = &self.a.views;
        let peek_ident = |v: &ViewParam| {
            let i = views
                .iter()
                .position(|w| std::ptr::eq(w, v))
                .expect("a view of this function");
            format_ident!("__dlcast_peek{i}")
        };
        let peeks = self.a.tparams.iter().map(|tp| {
            let i = tp.decided_by.expect("checked");
            let (peek, ident) = (peek_ident(&views[i]), &views[i].ident);
            let writable = views[i].kind.writable();
            quote!(let #peek = __dlcast.peek(#i, #ident, #writable)?;)
        });
        let peeks = peeks.collect();
        (
            peeks,
            dispatch_tokens(&self.a, 0, &mut Vec::new(), run, &peek_ident),
        )
    }

    /// What a returned array becomes, as the signature line says it:
    /// `like(x)` names the parameter whose framework it takes (the stub
    /// generator reads it from here).
    fn returned_array_type(&self) -> String {
        let views = &self.a.views;
        match &self.opts.returns {
            Some(Returns::Dlcast) => "dlcast.Array".to_string(),
            // The default: like the first (required) array parameter, else
            // NumPy; `like(x, numpy)`: an argument of no framework (a buffer,
            // a capsule) gets NumPy, where `returns = like(x)` keeps a
            // `dlcast.Array` (the stub generator types the two apart).
            None => match views.iter().find(|v| !v.optional).or(views.first()) {
                Some(v) => format!("like({}, numpy)", v.ident.unraw()),
                None => "numpy.ndarray".to_string(),
            },
            Some(Returns::Like(p)) => format!("like({})", p.unraw()),
            Some(Returns::Framework(f, _)) => f.facts().python_type.to_string(),
        }
    }

    /// The Python parameters with each array parameter's annotation
    /// (`ndarray[float32, (n, 3), cpu]`), and each view's introspection hint.
    fn annotated_params(&self) -> (Vec<(String, Option<String>)>, Vec<stubhint::Py>) {
        let a = &self.a;
        let mut py_params = a.py_params.clone();
        let mut view_hints = Vec::new();
        for v in &a.views {
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
                &self.dim_names,
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
        (py_params, view_hints)
    }

    /// The Python-facing signature and docstring line.
    fn signature_line(&self) -> SignatureLine {
        let (attrs, fn_name) = (self.attrs, &self.fn_name);
        let (py_params, view_hints) = self.annotated_params();
        let pyo3_attrs = pysig::scan_pyo3_attrs(attrs);
        let params_text = pysig::parameter_list(&py_params, pyo3_attrs.signature.as_ref());
        let receiver = if self.a.has_receiver {
            "self"
        } else if has_attr(attrs, "classmethod") {
            "cls"
        } else {
            ""
        };
        let new_line = has_attr(attrs, "new").then(|| pysig::init_line(&params_text));
        let params_text = pysig::with_receiver(receiver, &params_text);
        let array_type = self.returned_array_type();
        let ret = pysig::return_annotation(&self.sig.output, &array_type, self_name(self.ctx))
            .unwrap_or_else(|| "...".into());
        // The first docstring line, as pybind11 and nanobind write it: help()
        // shows it, and the stub generator parses it. (`__text_signature__`
        // stays PyO3's, without annotations, which `inspect.signature`
        // refuses.)
        let doc_line = format!(" {fn_name}({params_text}) -> {ret}");
        // Python shows its own docstring for a special method (a slot): the
        // line, and the doc comment, are kept in a class attribute.
        let class_attr = match new_line {
            Some(line) => Some(("__dlcast_new__".to_string(), line)),
            None if self.special && keeps_line(fn_name) => {
                Some(pysig::special_attr(fn_name, &doc_line, attrs))
            }
            None => None,
        };
        SignatureLine {
            doc_line,
            ret,
            view_hints,
            class_attr,
        }
    }

    /// The exported function: the docstring line, the static `FnSpec`, and
    /// `calls` (with the `inspect` feature, its arguments and result wrapped
    /// in the marker types PyO3's introspection reads, which are returned
    /// beside it).
    fn wrapper(&self, calls: TokenStream2, line: &SignatureLine) -> (TokenStream2, TokenStream2) {
        let (rt, pyo3) = runtime_paths();
        let (sig, attrs) = (self.sig, self.attrs);
        let mut outer_generics = sig.generics.clone();
        outer_generics.params = outer_generics
            .params
            .into_iter()
            .filter(|g| matches!(g, GenericParam::Lifetime(_)))
            .collect();
        if !self.a.tparams.is_empty() {
            outer_generics.where_clause = None;
        }
        let (py_param, ret_ty) = if self.plain_return {
            (quote!(), body_value_type(&sig.output))
        } else {
            (
                quote!(__dlcast_py: #pyo3::Python<'_>,),
                quote!(#pyo3::Py<#pyo3::PyAny>),
            )
        };
        let marker_base = match self.ctx {
            Ctx::Free => format!("Fn_{}", sig.ident.unraw()),
            Ctx::Method(class) => format!("Method_{class}__{}", sig.ident.unraw()),
        };
        let hints = stubhint::Inspect::new(
            &marker_base,
            &self.a.views,
            &line.view_hints,
            self.a.outer_params.clone(),
            (!self.plain_return).then_some(line.ret.as_str()),
        );
        let (outer_params, unwrap_args) = (hints.outer_params, hints.unwrap_args);
        let inner = match &hints.ret_ty {
            // The body's `return`s leave the closure; its result is wrapped.
            Some(_) => quote! {
                ::core::result::Result::map(
                    (|| -> #pyo3::PyResult<#pyo3::Py<#pyo3::PyAny>> { #calls })(),
                    #rt::Out::new,
                )
            },
            None => calls,
        };
        let ret_ty = hints.ret_ty.unwrap_or(ret_ty);
        let doc_line = &line.doc_line;
        let doc_sep = attrs
            .iter()
            .any(|a| a.path().is_ident("doc"))
            .then(|| quote!(#[doc = ""]));
        let (fn_token, ident, vis) = (&sig.fn_token, &sig.ident, &self.vis);
        let spec_ident = format_ident!("__DLCAST_SPEC");
        let (fn_name, dim_names) = (&self.fn_name, &self.dim_names);
        let param_specs = self.param_specs();
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
        (wrapper, hints.items)
    }
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
