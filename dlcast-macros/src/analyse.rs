//! Analysis: sorts a function's parameters into array parameters, plain
//! parameters and type parameters, checking every annotation against the
//! parameter's type; all errors are reported together.

use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{quote, ToTokens};
use syn::ext::IdentExt;
use syn::{Attribute, Error, FnArg, GenericParam, Ident, Pat, Signature, Type};

use crate::annot::{self, Annotations, Dim};
use crate::parse::{
    element_type, has_attr, mentions, named_lifetime, static_rank, ungroup, view_kind_of, ViewKind,
};
use crate::{pysig, stream};

/// An array parameter after parsing.
pub(crate) struct ViewParam {
    pub(crate) ident: Ident,
    pub(crate) ty: Type,
    pub(crate) optional: bool,
    pub(crate) kind: ViewKind,
    pub(crate) annots: Annotations,
    /// The shape the runtime checks: `#[shape(..)]`, with the rank the type
    /// fixes (`&[T]`, `ArrayView2`, `TensorRef<'_, T, 2>`) written in
    /// (`..` expanded, or `_` per axis without `#[shape]`).
    pub(crate) shape: Option<Vec<Dim>>,
    /// Index into the function's type parameters, if the element type is one.
    pub(crate) tparam: Option<usize>,
}

pub(crate) fn combine(errors: &mut Option<Error>, e: Error) {
    match errors {
        Some(all) => all.combine(e),
        None => *errors = Some(e),
    }
}

/// A type parameter of a dtype-generic function.
pub(crate) struct TypeParam {
    pub(crate) ident: Ident,
    /// `#[dtype(..)]` of the deciding parameter.
    pub(crate) dtypes: Vec<Ident>,
    /// Index into the views of the parameter that carries `#[dtype(..)]`.
    pub(crate) decided_by: Option<usize>,
}

/// The parameters of a function after parsing.
pub(crate) struct Analysis {
    pub(crate) views: Vec<ViewParam>,
    pub(crate) tparams: Vec<TypeParam>,
    /// The exported function's parameters (receiver included).
    pub(crate) outer_params: Vec<TokenStream2>,
    /// The body's arguments, in order (`self` first for a receiver).
    pub(crate) call_args: Vec<TokenStream2>,
    /// The Python-visible parameters and their annotations, in Rust order.
    pub(crate) py_params: Vec<(String, Option<String>)>,
    pub(crate) has_receiver: bool,
    /// The parameter marked `#[stream]`, if any.
    pub(crate) stream_param: Option<stream::StreamParam>,
}

/// Sorts a function's parameters into views, plain parameters and type
/// parameters, checking every annotation; all errors are reported together.
pub(crate) fn analyze(attrs: &[Attribute], sig: &Signature) -> syn::Result<Analysis> {
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
        if let Some(e) = attrs.iter().find_map(annot::misspelled) {
            combine(&mut errors, e);
            continue;
        }
        let Some((optional, inner, kind)) = view_kind_of(&pt.ty) else {
            if let Some(attr) = &annots.first {
                combine(
                    &mut errors,
                    Error::new_spanned(
                        attr,
                        "#[shape], #[device], #[order], #[dtype] and #[noconvert] apply to \
                         array parameters only: TensorRef, TensorMut, TensorDyn, TensorDynMut, \
                         &[T], &mut [T], ndarray's ArrayView / ArrayViewMut (ArrayView2, \
                         ArrayViewD, ..), or an Option of one",
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
        let shape = match check_type_annotations(inner, kind, &annots) {
            Ok(s) => s,
            Err(e) => {
                combine(&mut errors, e);
                continue;
            }
        };
        // The view borrows the call context, not the argument: the outer
        // function takes any lifetime.
        let obj = quote!(&#pyo3::Bound<'_, #pyo3::PyAny>);
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
            shape,
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

/// Checks the annotations of an array parameter against what its type
/// says (rank, writability, host memory) and returns the shape the runtime
/// checks (see [`ViewParam::shape`]).
pub(crate) fn check_type_annotations(
    ty: &Type,
    kind: ViewKind,
    annots: &Annotations,
) -> syn::Result<Option<Vec<Dim>>> {
    if kind.writable() {
        if let Some(attr) = annots.attr("noconvert") {
            return Err(Error::new_spanned(
                attr,
                "#[noconvert] means nothing on a writable parameter: writable parameters \
                 never convert (writes into a converted copy would be lost)",
            ));
        }
    }
    if kind.native() {
        if let (Some(devices), Some(attr)) = (&annots.devices, annots.attr("device")) {
            if let Some(d) = devices.iter().find(|d| !d.is_host()) {
                return Err(Error::new_spanned(
                    attr,
                    format!(
                        "`{}` is not memory the CPU can read; slices and ndarray views take \
                         cpu, cuda_host or rocm_host memory (use TensorRef / TensorMut for \
                         device memory)",
                        d.name
                    ),
                ));
            }
        }
    }
    let Some(rank) = static_rank(ty, kind)? else {
        return Ok(annots.shape.clone());
    };
    let Some(dims) = &annots.shape else {
        return Ok(Some((0..rank).map(|_| Dim::Any).collect()));
    };
    let fixed = dims.iter().filter(|d| !matches!(d, Dim::Rest)).count();
    let has_rest = fixed < dims.len();
    if fixed == rank || has_rest && fixed < rank {
        // `..` stands for the axes the others leave.
        let mut out = Vec::with_capacity(rank);
        for d in dims {
            match d {
                Dim::Rest => out.extend((0..rank - fixed).map(|_| Dim::Any)),
                d => out.push(d.clone()),
            }
        }
        return Ok(Some(out));
    }
    let attr = annots.attr("shape").map(|a| a.to_token_stream());
    Err(Error::new_spanned(
        attr.unwrap_or_else(|| ty.to_token_stream()),
        format!(
            "this #[shape] has {}{fixed} dimension{}, but the parameter's type has {rank}",
            if has_rest { "at least " } else { "" },
            if fixed == 1 { "" } else { "s" },
        ),
    ))
}
