//! Annotations on an `ArrayHandle<T>` parameter (`#[shape(n, 3)] w:
//! ArrayHandle<f32>`), or a rank in its type (`ArrayHandle<f32, 2>`): the
//! handle is made with a spec of its own and checked then (a read-only
//! borrow, dropped at once: the runtime's `ArrayHandle::check`), and every
//! later borrow checks the spec again (`ArrayHandle::with_spec`); its errors
//! name the function and parameter that declared it. Every handle
//! parameter also gets its Python annotation for the signature line
//! (`ndarray[float32, (n, 3), cpu]`), which the stub generator types.

use proc_macro2::TokenStream as TokenStream2;
use quote::{format_ident, quote, ToTokens};
use syn::ext::IdentExt;
use syn::punctuated::Punctuated;
use syn::{
    Error, FnArg, GenericArgument, Ident, Pat, PatType, PathArguments, Signature, Token, Type,
};

use crate::analyse::{check_type_annotations, combine};
use crate::annot::{self, Annotations, Dim};
use crate::parse::{option_inner, ungroup, ViewKind};
use crate::pysig;

/// The generic arguments of `ArrayHandle<T>` / `ArrayHandle<T, N>`, if `ty`
/// is spelled as one, and its element type.
fn handle_args(ty: &Type) -> Option<(&Punctuated<GenericArgument, Token![,]>, &Type)> {
    let Type::Path(p) = ungroup(ty) else {
        return None;
    };
    let last = p.path.segments.last()?;
    if last.ident != "ArrayHandle" {
        return None;
    }
    match &last.arguments {
        PathArguments::AngleBracketed(a) => {
            let elem = a.args.iter().find_map(|g| match g {
                GenericArgument::Type(t) => Some(t),
                _ => None,
            })?;
            Some((&a.args, elem))
        }
        _ => None,
    }
}

/// What [`rewrite`] makes: the helper items, and the Python annotation of
/// each `ArrayHandle` parameter, by name, for the signature line.
pub(crate) struct Handles {
    pub(crate) items: TokenStream2,
    pub(crate) annotations: Vec<(String, String)>,
}

/// Gives the `ArrayHandle` parameters among `py_params` (the signature
/// line's parameters) their annotations.
pub(crate) fn annotate(
    py_params: &mut [(String, Option<String>)],
    annotations: &[(String, String)],
) {
    for (name, ann) in annotations {
        if let Some(p) = py_params.iter_mut().find(|(n, _)| n == name) {
            p.1 = Some(ann.clone());
        }
    }
}

/// Takes the annotations off each annotated or rank-typed `ArrayHandle`
/// (or `Option<ArrayHandle<..>>`) parameter of `sig` and gives it PyO3's
/// `#[pyo3(from_py_with = ..)]` instead, naming a function (returned, an
/// item beside the function or `impl` block) that makes the handle with a
/// spec of those annotations and checks it. `py_name` is what its errors
/// call the function (`Layer` for a `#[new]`, `Layer.store`, `total`);
/// `base` names the helper functions uniquely in the module.
pub(crate) fn rewrite(sig: &mut Signature, py_name: &str, base: &str) -> syn::Result<Handles> {
    let mut handles = Handles {
        items: TokenStream2::new(),
        annotations: Vec::new(),
    };
    let mut errors: Option<Error> = None;
    for arg in sig.inputs.iter_mut() {
        let FnArg::Typed(pt) = arg else { continue };
        if let Err(e) = rewrite_param(pt, py_name, base, &mut handles) {
            combine(&mut errors, e);
        }
    }
    match errors {
        Some(e) => Err(e),
        None => Ok(handles),
    }
}

/// One parameter of [`rewrite`]: nothing unless it is an `ArrayHandle`; its
/// annotation for the signature line; for an annotated or rank-typed one,
/// the helper that makes and checks it, named in `from_py_with`.
fn rewrite_param(
    pt: &mut PatType,
    py_name: &str,
    base: &str,
    handles: &mut Handles,
) -> syn::Result<()> {
    let (optional, inner) = match option_inner(&pt.ty) {
        Some(t) => (true, t.clone()),
        None => (false, (*pt.ty).clone()),
    };
    let Some((args, elem)) = handle_args(&inner) else {
        return Ok(());
    };
    let (args, elem) = (args.clone(), elem.clone());
    // `ArrayHandle<T, N>`: a rank in the type, checked when passed.
    let ranked = args.len() > 1;
    let annots = annot::take(&mut pt.attrs)?;
    // The shape the spec checks: `#[shape(..)]` with the type's rank
    // written in (a `#[shape]` of another rank is refused here).
    let shape = check_type_annotations(&inner, ViewKind::Ref, &annots)?;
    let dim_names = annot::dim_names(shape.iter().flatten());
    if let Pat::Ident(pi) = &*pt.pat {
        let dtype = pysig::element_name(&elem)
            .map(String::from)
            .unwrap_or_else(|| elem.to_token_stream().to_string().replace(' ', ""));
        handles.annotations.push((
            pi.ident.unraw().to_string(),
            pysig::array_annotation(
                &annots,
                shape.as_deref(),
                Some(dtype),
                &dim_names,
                false,
                optional,
            ),
        ));
    }
    if annots.first.is_none() && !ranked {
        return Ok(());
    }

    let refused = refuse_view_only_annotations(&annots);
    let Pat::Ident(pi) = &*pt.pat else {
        let e = Error::new_spanned(
            &pt.pat,
            "an annotated ArrayHandle parameter needs a plain name",
        );
        return Err(with_first(refused, e));
    };
    if let Some(e) = refused {
        return Err(e);
    }
    let param = pi.ident.unraw().to_string();
    let helper = format_ident!("__dlcast_handle_{}__{}", base, param);
    let spec = HandleSpec {
        py_name,
        param: &param,
        shape: shape.as_deref(),
        dim_names: &dim_names,
        annots: &annots,
    };
    handles
        .items
        .extend(helper_fn(&helper, &spec, &args, optional));
    pt.attrs
        .push(syn::parse_quote!(#[pyo3(from_py_with = #helper)]));
    Ok(())
}

/// `first`'s errors followed by `then`.
fn with_first(first: Option<Error>, then: Error) -> Error {
    let mut all = first;
    combine(&mut all, then);
    all.expect("combined")
}

/// The errors for `#[dtype]` and `#[noconvert]` on an `ArrayHandle`, which
/// its type and its borrows decide.
fn refuse_view_only_annotations(annots: &Annotations) -> Option<Error> {
    let mut errors = None;
    for name in ["dtype", "noconvert"] {
        if let Some(attr) = annots.attr(name) {
            let why = if name == "dtype" {
                "the `T` of `ArrayHandle<T>` fixes its dtype"
            } else {
                "its borrows never convert"
            };
            combine(
                &mut errors,
                Error::new_spanned(
                    attr,
                    format!(
                        "#[{name}] does not apply to an ArrayHandle: {why}; it takes \
                         #[shape(..)], #[device(..)] and #[order(..)], checked at each borrow"
                    ),
                ),
            );
        }
    }
    errors
}

/// What a handle's spec says: the function and parameter its errors name,
/// and the constraints checked at each borrow.
struct HandleSpec<'a> {
    py_name: &'a str,
    param: &'a str,
    shape: Option<&'a [Dim]>,
    dim_names: &'a [String],
    annots: &'a Annotations,
}

/// The helper PyO3 calls (`from_py_with`) to make the handle: `None`
/// refused for a required handle (or passed on for an optional one), the
/// handle made with its own spec and checked once.
fn helper_fn(
    helper: &Ident,
    spec: &HandleSpec<'_>,
    args: &Punctuated<GenericArgument, Token![,]>,
    optional: bool,
) -> TokenStream2 {
    let rt = quote!(::dlcast_runtime::__private);
    let pyo3 = quote!(#rt::pyo3);
    let HandleSpec {
        py_name,
        param,
        dim_names,
        ..
    } = *spec;
    let shape = annot::shape_tokens(&rt, spec.shape, dim_names);
    let devices = annot::devices_tokens(&rt, spec.annots.devices.as_deref());
    let order = annot::order_tokens(&rt, spec.annots.order);
    // The type as written (`ArrayHandle<f32, 2>`), from dlcast's path.
    let handle = quote!(::dlcast_runtime::ArrayHandle<#args>);
    // `None` is refused for a required handle, as PyO3's extraction of
    // one refuses it, naming the function and parameter.
    let refuse_none = format!(
        "{py_name}(): argument '{param}': expected an array (any DLPack producer), got None"
    );
    let make = quote! {
        if #pyo3::types::PyAnyMethods::is_none(obj) {
            return ::core::result::Result::Err(
                #pyo3::exceptions::PyTypeError::new_err(#refuse_none),
            );
        }
        // Checked now (a read-only borrow, dropped at once), and again
        // at every borrow: Python code may change the array meanwhile.
        let handle: #handle = ::dlcast_runtime::ArrayHandle::with_spec(obj, &SPEC);
        handle.check(obj.py())?;
        handle
    };
    let (ret, body) = if optional {
        (
            quote!(::core::option::Option<#handle>),
            quote! {
                if #pyo3::types::PyAnyMethods::is_none(obj) {
                    return ::core::result::Result::Ok(::core::option::Option::None);
                }
                ::core::result::Result::Ok(::core::option::Option::Some({ #make }))
            },
        )
    } else {
        (
            handle.clone(),
            quote!(::core::result::Result::Ok({ #make })),
        )
    };
    quote! {
        #[doc(hidden)]
        #[allow(non_snake_case)]
        fn #helper(obj: &#pyo3::Bound<'_, #pyo3::PyAny>) -> #pyo3::PyResult<#ret> {
            static SPEC: #rt::FnSpec = #rt::FnSpec {
                name: #py_name,
                dim_names: &[#(#dim_names),*],
                params: &[#rt::ParamSpec {
                    name: #param, shape: #shape, devices: #devices, order: #order,
                    convert: false, aligned: false, dtypes: &[],
                    shares_dtype: ::core::option::Option::None,
                }],
            };
            #body
        }
    }
}
