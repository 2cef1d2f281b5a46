//! The signature line of a `#[pymethods]` method that takes no arrays (and
//! is not expanded): it reads the method as `#[dlpack_fn]` would, so it
//! sits above the analysis, the `ArrayHandle` annotations and the signature
//! text it combines (which do not depend on it).

use syn::ext::IdentExt;
use syn::Attribute;

use crate::analyse::analyze;
use crate::handle;
use crate::parse::has_attr;
use crate::pysig::{init_line, parameter_list, return_annotation, scan_pyo3_attrs, with_receiver};

/// The signature line and the `#[new]` line (if it is one) of a method of a
/// `#[pymethods]` block that takes no arrays, from its Rust types: what a
/// `#[dlpack_fn]` function's line says, so that the stub types the whole
/// class. `None` where the method is no plain callable (a setter) or its
/// parameters cannot be read. `handle_annotations`: the `ArrayHandle`
/// parameters' annotations (`crate::handle::rewrite`).
pub(crate) fn plain_method_line(
    attrs: &[Attribute],
    sig: &syn::Signature,
    class: &str,
    handle_annotations: &[(String, String)],
) -> Option<(String, Option<String>)> {
    let has = |name: &str| has_attr(attrs, name);
    if has("setter") {
        return None;
    }
    let mut a = analyze(attrs, sig).ok()?;
    handle::annotate(&mut a.py_params, handle_annotations);
    let pyo3 = scan_pyo3_attrs(attrs);
    let params_text = parameter_list(&a.py_params, pyo3.signature.as_ref());
    if has("new") {
        return Some((String::new(), Some(init_line(&params_text))));
    }
    let receiver = if a.has_receiver {
        "self"
    } else if has("classmethod") {
        "cls"
    } else {
        ""
    };
    let name = pyo3.name.unwrap_or_else(|| sig.ident.unraw().to_string());
    // Arrays it returns convert themselves: a `dlcast.Array`.
    let ret =
        return_annotation(&sig.output, "dlcast.Array", Some(class)).unwrap_or_else(|| "...".into());
    Some((
        format!(
            " {name}({}) -> {ret}",
            with_receiver(receiver, &params_text)
        ),
        None,
    ))
}
