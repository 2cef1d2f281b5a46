//! Annotations on an `ArrayHandle<T>` parameter (`#[shape(n, 3)] w:
//! ArrayHandle<f32>`): the handle is made with a spec of its own, so that
//! every later borrow checks them (the runtime's `ArrayHandle::with_spec`),
//! and its errors name the function and parameter that declared them.

use proc_macro2::TokenStream as TokenStream2;
use quote::{format_ident, quote};
use syn::ext::IdentExt;
use syn::{Error, FnArg, GenericArgument, Pat, PathArguments, Signature, Type};

use crate::analyse::combine;
use crate::annot::{self, Dim};
use crate::parse::{option_inner, ungroup};

/// The element type of `ArrayHandle<T>`, if `ty` is spelled as one.
fn handle_element(ty: &Type) -> Option<&Type> {
    let Type::Path(p) = ungroup(ty) else {
        return None;
    };
    let last = p.path.segments.last()?;
    if last.ident != "ArrayHandle" {
        return None;
    }
    match &last.arguments {
        PathArguments::AngleBracketed(a) => a.args.iter().find_map(|g| match g {
            GenericArgument::Type(t) => Some(t),
            _ => None,
        }),
        _ => None,
    }
}

/// Takes the annotations off each annotated `ArrayHandle<T>` (or
/// `Option<ArrayHandle<T>>`) parameter of `sig` and gives it PyO3's
/// `#[pyo3(from_py_with = ..)]` instead, naming a function (returned, an
/// item beside the function or `impl` block) that makes the handle with a
/// spec of those annotations. `py_name` is what its errors call the
/// function (`Layer` for a `#[new]`, `Layer.store`, `total`); `base`
/// names the helper functions uniquely in the module.
pub(crate) fn rewrite(sig: &mut Signature, py_name: &str, base: &str) -> syn::Result<TokenStream2> {
    let rt = quote!(::dlcast_runtime::__private);
    let pyo3 = quote!(#rt::pyo3);
    let mut items = TokenStream2::new();
    let mut errors: Option<Error> = None;
    for arg in sig.inputs.iter_mut() {
        let FnArg::Typed(pt) = arg else { continue };
        let (optional, inner) = match option_inner(&pt.ty) {
            Some(t) => (true, t),
            None => (false, &*pt.ty),
        };
        let Some(elem) = handle_element(inner).cloned() else {
            continue;
        };
        let annots = match annot::take(&mut pt.attrs) {
            Ok(a) if a.first.is_none() => continue,
            Ok(a) => a,
            Err(e) => {
                combine(&mut errors, e);
                continue;
            }
        };
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
        let Pat::Ident(pi) = &*pt.pat else {
            combine(
                &mut errors,
                Error::new_spanned(
                    &pt.pat,
                    "an annotated ArrayHandle parameter needs a plain name",
                ),
            );
            continue;
        };
        let param = pi.ident.unraw().to_string();
        let mut dim_names: Vec<String> = Vec::new();
        let shape = match &annots.shape {
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
        let devices = annot::devices_tokens(&rt, annots.devices.as_deref());
        let order = annot::order_tokens(&rt, annots.order);
        let helper = format_ident!("__dlcast_handle_{}__{}", base, param);
        let handle = quote!(::dlcast_runtime::ArrayHandle<#elem>);
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
            ::dlcast_runtime::ArrayHandle::with_spec(obj, &SPEC)
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
        items.extend(quote! {
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
        });
        pt.attrs
            .push(syn::parse_quote!(#[pyo3(from_py_with = #helper)]));
    }
    match errors {
        Some(e) => Err(e),
        None => Ok(items),
    }
}
