//! Stream options: `#[dlpack_fn(stream = legacy | per_thread | no_sync |
//! producer)]` and a parameter marked `#[stream]` whose integer value is the
//! stream handle GPU inputs are asked for (see `dlcast_runtime::stream`).

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::meta::ParseNestedMeta;
use syn::spanned::Spanned;
use syn::{Attribute, Error, Ident, Pat, PatType};

/// The function-level choices and the runtime's names for them.
const CHOICES: &[(&str, &str)] = &[
    ("producer", "Producer"),
    ("legacy", "Legacy"),
    ("per_thread", "PerThread"),
    ("no_sync", "NoSync"),
];

/// Parses the value of `stream = ...` in `#[dlpack_fn(...)]` into the
/// runtime's `StreamRequest` variant; `slot` refuses a second one.
pub fn parse_option(meta: &ParseNestedMeta<'_>, slot: &mut Option<Ident>) -> syn::Result<()> {
    if slot.is_some() {
        return Err(meta.error("duplicate `stream`"));
    }
    let value: Ident = meta.value()?.parse()?;
    let Some((_, variant)) = CHOICES.iter().find(|(n, _)| value == n) else {
        let names: Vec<&str> = CHOICES.iter().map(|(n, _)| *n).collect();
        return Err(Error::new_spanned(
            &value,
            format!(
                "unknown stream `{value}`; expected one of: {} \
                 (or mark an integer parameter #[stream] for a stream handle)",
                names.join(", ")
            ),
        ));
    };
    *slot = Some(Ident::new(variant, value.span()));
    Ok(())
}

/// Removes `#[stream]` from a parameter's attributes; `Ok(Some(attr))` if
/// it was there (once, without arguments).
pub fn take_attr(attrs: &mut Vec<Attribute>) -> syn::Result<Option<Attribute>> {
    let mut found: Option<Attribute> = None;
    let mut err: Option<Error> = None;
    attrs.retain(|a| {
        if !a.path().is_ident("stream") {
            return true;
        }
        let e = if found.is_some() {
            Some(Error::new(
                a.path().span(),
                "duplicate #[stream] on this parameter",
            ))
        } else if !matches!(a.meta, syn::Meta::Path(_)) {
            Some(Error::new_spanned(
                a,
                "write #[stream] without arguments; its integer value is the stream handle",
            ))
        } else {
            None
        };
        match e {
            Some(e) => match &mut err {
                Some(all) => all.combine(e),
                None => err = Some(e),
            },
            None => found = Some(a.clone()),
        }
        false
    });
    match err {
        Some(e) => Err(e),
        None => Ok(found),
    }
}

/// The parameter marked `#[stream]`, checked: a plain name, the only one of
/// the function.
pub struct StreamParam {
    pub ident: Ident,
    attr: Attribute,
}

/// Records the `#[stream]` parameter `pt`, refusing a second one.
pub fn record(slot: &mut Option<StreamParam>, attr: Attribute, pt: &PatType) -> syn::Result<()> {
    if let Some(first) = slot {
        let mut e = Error::new_spanned(&attr, "only one parameter can be marked #[stream]");
        e.combine(Error::new_spanned(
            &first.attr,
            "the first #[stream] is here",
        ));
        return Err(e);
    }
    let Pat::Ident(pi) = &*pt.pat else {
        return Err(Error::new_spanned(
            &pt.pat,
            "a #[stream] parameter needs a plain name, e.g. `#[stream] stream: usize`",
        ));
    };
    *slot = Some(StreamParam {
        ident: pi.ident.clone(),
        attr,
    });
    Ok(())
}

/// The error for `#[stream]` on an array parameter.
pub fn on_view_error(attr: &Attribute) -> Error {
    Error::new_spanned(
        attr,
        "#[stream] marks an integer parameter holding a stream handle, not an array",
    )
}

/// Statements run right after the call context is made: the function's
/// stream choice, then the `#[stream]` parameter's value (which wins when it
/// is not `None`).
pub fn setup_tokens(
    rt: &TokenStream,
    fn_name: &str,
    option: Option<&Ident>,
    param: Option<&StreamParam>,
) -> TokenStream {
    let mut out = TokenStream::new();
    if let Some(v) = option {
        out.extend(quote!(__dlcast.set_stream(#rt::StreamRequest::#v);));
    }
    if let Some(p) = param {
        let ident = &p.ident;
        let name = ident.to_string();
        out.extend(quote_spanned!(ident.span()=>
            __dlcast.stream_param(#fn_name, #name, &#ident)?;
        ));
    }
    out
}
