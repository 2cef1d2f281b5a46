//! The `#[dlpack_fn]` attribute macro. Use it through `dlcast_runtime`,
//! which re-exports it and does all the work at run time; this crate only
//! parses, checks the annotations with precise spans, and emits one static
//! description of the constraints plus one runtime call per parameter.

use proc_macro::TokenStream;
use proc_macro2::TokenStream as TokenStream2;
use quote::quote;
use syn::{parse_macro_input, Error, FnArg, ImplItem, Item, ItemFn, ItemImpl, Type};

mod analyse;
mod annot;
mod emit;
// The framework and dtype tables, shared with the runtime (a symlink to
// `dlcast-runtime/src/facts.rs`); the macro reads only some columns.
#[allow(dead_code)]
mod facts;
mod handle;
mod parse;
mod plain_method;
mod pysig;
mod stream;
mod stubhint;

use analyse::combine;
use emit::{expand_callable, Ctx};
use parse::{
    has_array_params, has_attr, parse_options, split_options, take_method_options, FnOptions,
};

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
/// owned `Tensor<T>` and views of its inputs (exported zero-copy), inside
/// `Option`, `PyResult`, tuples or `Vec`s. Each returned array goes to the
/// framework of the first array argument (the first required one), or to
/// NumPy without one; where that framework refuses it, it stays a
/// `dlcast.Array`.
///
/// Options: `#[dlpack_fn(returns = <framework>)]`, where `<framework>` is
/// `numpy`, `torch`, `jax`, `cupy`, `tensorflow`, `array_api`, `memoryview`, `mlx` or `paddle`
/// (the framework table of `dlcast_runtime`, from which a test writes this
/// list) or `like(param)`,
/// hands every returned array to that framework instead, strictly;
/// `returns = dlcast` keeps the plain `dlcast.Array`. On a return type that
/// holds no array (`&[f32]`, `f64`) `returns` is an error. `#[dlpack_fn(noconvert)]` turns conversion off
/// for every parameter.
///
/// Place it above `#[pyfunction]`, or, for methods, on the `impl` block
/// above `#[pymethods]` (methods may carry their own `#[dlpack_fn(..)]` or
/// `#[dlcast(..)]` options there); or write the one attribute
/// [`macro@pyfunction`] / [`macro@pymethods`] instead of PyO3's.
#[proc_macro_attribute]
pub fn dlpack_fn(attr: TokenStream, item: TokenStream) -> TokenStream {
    let item = parse_macro_input!(item as Item);
    let out = parse_options(attr.into()).and_then(|opts| match item.clone() {
        Item::Fn(func) => expand_fn(&opts, func),
        Item::Impl(imp) => expand_impl(&opts, imp),
        other => Err(Error::new_spanned(
            other,
            "#[dlpack_fn] applies to a function marked #[pyfunction], \
             or to an impl block marked #[pymethods]",
        )),
    });
    or_fallback(out, item)
}

/// `#[pyfunction]` and `#[dlpack_fn]` in one: a PyO3 function whose array
/// parameters take any DLPack producer (see [`dlpack_fn`]). Its options are
/// dlcast's (`returns = ..`, `noconvert`, `stream = ..`) and PyO3's
/// (`name = ".."`, `signature = (..)`, ...: every other one, passed to
/// `#[pyfunction(..)]` as written), in any order:
/// `#[dlcast::pyfunction(name = "head", returns = numpy)]`.
#[proc_macro_attribute]
pub fn pyfunction(attr: TokenStream, item: TokenStream) -> TokenStream {
    let func = parse_macro_input!(item as ItemFn);
    let out = split_options(attr.into()).and_then(|(opts, pyo3_opts)| {
        let mut func = func.clone();
        let pyo3_opts = (!pyo3_opts.is_empty()).then(|| quote!((#pyo3_opts)));
        let attr = syn::parse_quote!(#[::dlcast_runtime::__private::pyo3::pyfunction #pyo3_opts]);
        func.attrs.insert(0, attr);
        let probe = module_probe(&func.sig.ident);
        expand_fn(&opts, func).map(|f| quote!(#f #probe))
    });
    or_fallback(out, Item::Fn(func))
}

/// A compile error where `#[dlcast::pyfunction]` stands inside a
/// `#[pymodule] mod`: PyO3's attribute on the module expands first and
/// registers the functions whose attribute it recognises by name
/// (`#[pyfunction]`, `#[pyo3::pyfunction]`), so this one would silently be
/// left out of the module, and no later expansion can add it.
///
/// Only such a module declares the item `__PYO3_NAME` (PyO3's module
/// name). The probe imports a stand-in of that name by a glob, which a
/// declared item shadows, and requires the name to be the stand-in (an
/// `f32`; PyO3's is a `&CStr`). Every probe's glob brings the same item
/// (`core::f32::consts::PI`), so several in one module are not ambiguous.
fn module_probe(ident: &syn::Ident) -> TokenStream2 {
    let module = quote::format_ident!("__dlcast_probe_{}", syn::ext::IdentExt::unraw(ident));
    let check = quote::quote_spanned!(ident.span()=> __dlcast_outside_pymodule_mod(__PYO3_NAME));
    quote! {
        #[doc(hidden)]
        #[allow(non_snake_case)]
        mod #module {
            #[allow(unused_imports, unreachable_pub)]
            pub use ::core::f32::consts::PI as __PYO3_NAME;
        }
        #[allow(unused_imports)]
        use #module::*;
        const _: () = {
            #[diagnostic::on_unimplemented(
                message = "`#[dlcast::pyfunction]` inside a `#[pymodule] mod` is left out of the module: write `#[dlpack_fn]` above `#[pyfunction]` here",
                label = "not added to the module",
                note = "PyO3 adds the functions of a `#[pymodule] mod` that carry `#[pyfunction]`, read before dlcast's attribute expands; `#[dlpack_fn]` above `#[pyfunction]` makes the same function, and PyO3 sees it"
            )]
            trait OutsidePymoduleMod {}
            impl OutsidePymoduleMod for f32 {}
            fn __dlcast_outside_pymodule_mod<T: OutsidePymoduleMod>(_: T) {}
            #[allow(dead_code)]
            fn probe() {
                #check;
            }
        };
    }
}

/// `#[pymethods]` and `#[dlpack_fn]` in one, on an `impl` block: its
/// methods with array parameters take any DLPack producer. The block's
/// options are split as [`pyfunction`]'s (dlcast's apply to every method);
/// a method's own go in `#[dlcast(returns = .., noconvert, stream = ..)]`.
#[proc_macro_attribute]
pub fn pymethods(attr: TokenStream, item: TokenStream) -> TokenStream {
    let imp = parse_macro_input!(item as ItemImpl);
    let out = split_options(attr.into()).and_then(|(opts, pyo3_opts)| {
        let mut imp = imp.clone();
        let pyo3_opts = (!pyo3_opts.is_empty()).then(|| quote!((#pyo3_opts)));
        let attr = syn::parse_quote!(#[::dlcast_runtime::__private::pyo3::pymethods #pyo3_opts]);
        imp.attrs.insert(0, attr);
        expand_impl(&opts, imp)
    });
    or_fallback(out, Item::Impl(imp))
}

/// The expansion, or after an error the error and the item as plain Rust:
/// without dlcast's annotations and PyO3's attributes, so that the error
/// comes alone (no "unused import" for what only the item uses, no PyO3
/// error on the view types).
fn or_fallback(out: syn::Result<TokenStream2>, item: Item) -> TokenStream {
    let Err(e) = out else {
        return out.unwrap_or_default().into();
    };
    let err = e.to_compile_error();
    // PyO3's attribute macros are named once more, by a `use` (their
    // imports stay used).
    let mut uses = Vec::new();
    let mut kept = |attrs: &mut Vec<syn::Attribute>| {
        attrs.retain(|a| {
            let path = a.path();
            if path
                .segments
                .last()
                .is_some_and(|s| s.ident == "pyfunction" || s.ident == "pymethods")
            {
                uses.push(quote!(#[allow(unused_imports)] use #path as _;));
            }
            ["doc", "cfg", "cfg_attr", "allow", "expect", "warn", "deny"]
                .iter()
                .any(|n| path.is_ident(n))
        })
    };
    let strip_params = |sig: &mut syn::Signature| {
        for arg in sig.inputs.iter_mut() {
            if let FnArg::Typed(pt) = arg {
                pt.attrs.clear();
            }
        }
    };
    let item = match item {
        Item::Fn(mut f) => {
            kept(&mut f.attrs);
            strip_params(&mut f.sig);
            quote!(#[allow(dead_code)] #f)
        }
        Item::Impl(mut imp) => {
            kept(&mut imp.attrs);
            for it in imp.items.iter_mut() {
                if let ImplItem::Fn(m) = it {
                    kept(&mut m.attrs);
                    strip_params(&mut m.sig);
                }
            }
            quote!(#[allow(dead_code)] #imp)
        }
        other => quote!(#other),
    };
    quote!(#err #(#uses)* #item).into()
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
        mut sig,
        block,
    } = func;
    let name = pysig::scan_pyo3_attrs(&attrs)
        .name
        .unwrap_or_else(|| syn::ext::IdentExt::unraw(&sig.ident).to_string());
    let base = syn::ext::IdentExt::unraw(&sig.ident).to_string();
    let handles = handle::rewrite(&mut sig, &name, &base)?;
    let g = expand_callable(
        opts,
        &attrs,
        &vis,
        &sig,
        &block,
        &Ctx::Free,
        &handles.annotations,
    )?;
    let (body, wrapper, hints, helpers) = (g.body, g.wrapper, g.hint_items, handles.items);
    Ok(quote!(#body #hints #helpers #wrapper))
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
    let class = match &*imp.self_ty {
        Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
        _ => None,
    };
    let mut out = Methods::default();
    let mut errors: Option<Error> = None;
    for item in imp.items.iter_mut() {
        let ImplItem::Fn(m) = item else { continue };
        match expand_method(opts, m, class.as_deref(), &mut out) {
            Ok(Some(g)) => {
                out.class_attrs.extend(g.class_attr);
                *m = syn::parse2(g.wrapper)?;
                out.bodies.push(g.body);
                out.hints.extend(g.hint_items);
            }
            Ok(None) => {}
            Err(e) => combine(&mut errors, e),
        }
    }
    if let Some(e) = errors {
        return Err(e);
    }

    push_class_attrs(&mut imp, out.class_attrs);
    let (impl_generics, _, where_clause) = imp.generics.split_for_impl();
    let self_ty = &imp.self_ty;
    let (bodies, hints) = (&out.bodies, &out.hints);
    Ok(quote! {
        #imp
        impl #impl_generics #self_ty #where_clause {
            #(#bodies)*
        }
        #hints
    })
}

/// What the methods of a `#[pymethods]` block add beside themselves.
#[derive(Default)]
struct Methods {
    /// The bodies, associated functions of a second, plain `impl` block.
    bodies: Vec<TokenStream2>,
    /// The `#[new]` line and special methods' lines, kept in class
    /// attributes (see `Generated::class_attr`).
    class_attrs: Vec<(String, String)>,
    /// Items beside the block: `ArrayHandle` helpers and introspection hints.
    hints: TokenStream2,
}

/// One method of the block: its `ArrayHandle` parameters rewritten, then
/// either expanded (returned, for the caller to put in its place) or, without
/// array parameters or options of its own, only given its signature line.
fn expand_method(
    opts: &FnOptions,
    m: &mut syn::ImplItemFn,
    class: Option<&str>,
    out: &mut Methods,
) -> syn::Result<Option<emit::Generated>> {
    let name = pysig::scan_pyo3_attrs(&m.attrs)
        .name
        .unwrap_or_else(|| syn::ext::IdentExt::unraw(&m.sig.ident).to_string());
    // Annotated `ArrayHandle` parameters: errors name the class for
    // `#[new]`, else `Class.method`.
    let class_name = class.unwrap_or("...");
    let py_name = if has_attr(&m.attrs, "new") {
        class_name.to_string()
    } else {
        format!("{class_name}.{name}")
    };
    let base = format!("{class_name}__{}", syn::ext::IdentExt::unraw(&m.sig.ident));
    let handles = handle::rewrite(&mut m.sig, &py_name, &base)?;
    out.hints.extend(handles.items);
    let handle_annotations = handles.annotations;
    let own = take_method_options(&mut m.attrs)?;
    if own.is_none() && !has_array_params(&m.sig) {
        add_plain_method_line(m, class_name, &name, &handle_annotations, out);
        return Ok(None);
    }

    let mut mopts = own.unwrap_or_default();
    mopts.noconvert |= opts.noconvert;
    if mopts.returns.is_none() {
        mopts.returns = opts.returns.clone();
        mopts.returns_inherited = true;
    }
    if mopts.stream.is_none() {
        mopts.stream = opts.stream.clone();
    }
    let ctx = Ctx::Method(class_name.to_string());
    expand_callable(
        &mopts,
        &m.attrs,
        &m.vis,
        &m.sig,
        &m.block,
        &ctx,
        &handle_annotations,
    )
    .map(Some)
}

/// A method that takes no arrays gets its signature line, for help() and
/// the stub generator: as its first doc line, or in a class attribute for
/// `#[new]` and the special methods whose docstring Python shows its own.
fn add_plain_method_line(
    m: &mut syn::ImplItemFn,
    class: &str,
    name: &str,
    handle_annotations: &[(String, String)],
    out: &mut Methods,
) {
    match plain_method::plain_method_line(&m.attrs, &m.sig, class, handle_annotations) {
        Some((_, Some(init))) => out.class_attrs.push(("__dlcast_new__".into(), init)),
        Some((line, None)) if emit::is_dunder(name) => {
            // No line where it would not say what Python sees (see `emit::keeps_line`).
            if !emit::keeps_line(name) {
                return;
            }
            out.class_attrs
                .push(pysig::special_attr(name, &line, &m.attrs));
        }
        Some((line, None)) => {
            if m.attrs.iter().any(|a| a.path().is_ident("doc")) {
                m.attrs.insert(0, syn::parse_quote!(#[doc = ""]));
            }
            m.attrs.insert(0, syn::parse_quote!(#[doc = #line]));
        }
        None => {}
    }
}

/// Each kept line as a `#[classattr]` of the block, where the stub
/// generator finds it.
fn push_class_attrs(imp: &mut ItemImpl, class_attrs: Vec<(String, String)>) {
    for (name, text) in class_attrs {
        let name = syn::Ident::new(&name, proc_macro2::Span::call_site());
        imp.items.push(syn::parse_quote! {
            #[classattr]
            #[allow(non_snake_case)]
            fn #name() -> &'static str {
                #text
            }
        });
    }
}
