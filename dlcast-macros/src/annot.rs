//! Parsing of the parameter annotations `#[shape(..)]`, `#[device(..)]`,
//! `#[order(..)]`, `#[dtype(..)]` and `#[noconvert]`, with errors spanned on
//! the faulty token.

use proc_macro2::TokenStream;
use quote::quote;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Attribute, Error, Ident, LitInt, Token};

use crate::facts::DTYPES;

/// One entry of `#[shape(..)]`.
#[derive(Clone)]
pub enum Dim {
    Fixed(usize),
    Any,
    Named(Ident),
    Rest,
}

impl Parse for Dim {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let la = input.lookahead1();
        if la.peek(Token![..]) {
            input.parse::<Token![..]>()?;
            Ok(Dim::Rest)
        } else if la.peek(Token![_]) {
            input.parse::<Token![_]>()?;
            Ok(Dim::Any)
        } else if la.peek(Ident) {
            Ok(Dim::Named(input.parse()?))
        } else if la.peek(LitInt) {
            let lit: LitInt = input.parse()?;
            let n = lit
                .base10_parse::<usize>()
                .map_err(|_| Error::new(lit.span(), "an extent must be a non-negative integer"))?;
            if !lit.suffix().is_empty() {
                return Err(Error::new(
                    lit.span(),
                    "write the extent without a type suffix",
                ));
            }
            Ok(Dim::Fixed(n))
        } else if input.peek(syn::Lit) {
            let lit: syn::Lit = input.parse()?;
            Err(Error::new(
                lit.span(),
                "an extent must be an integer, `_`, `..` or a name",
            ))
        } else {
            Err(la.error())
        }
    }
}

/// Device names accepted in `#[device(..)]` and their DLPack codes
/// (`None`: any device type the header defines).
const DEVICES: &[(&str, Option<i32>)] = &[
    ("cpu", Some(1)),
    ("cuda", Some(2)),
    ("cuda_host", Some(3)),
    ("opencl", Some(4)),
    ("vulkan", Some(7)),
    ("metal", Some(8)),
    ("rocm", Some(10)),
    ("rocm_host", Some(11)),
    ("cuda_managed", Some(13)),
    ("oneapi", Some(14)),
    ("any", None),
];

/// One entry of `#[device(..)]`: a name and an optional device id.
pub struct DeviceEntry {
    pub name: String,
    code: Option<i32>,
    pub id: Option<i32>,
}

impl DeviceEntry {
    /// Whether the device's memory is host memory the CPU reads directly
    /// (`cpu`, `cuda_host`, `rocm_host`).
    pub fn is_host(&self) -> bool {
        matches!(self.code, Some(1 | 3 | 11))
    }
}

impl Parse for DeviceEntry {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let name: Ident = input.parse()?;
        let Some(&(_, code)) = DEVICES.iter().find(|(n, _)| name == n) else {
            let known: Vec<&str> = DEVICES.iter().map(|(n, _)| *n).collect();
            return Err(Error::new(
                name.span(),
                format!(
                    "unknown device `{name}`; expected one of: {}",
                    known.join(", ")
                ),
            ));
        };
        let id = if input.peek(syn::token::Paren) {
            let inner;
            syn::parenthesized!(inner in input);
            let lit: LitInt = inner.parse()?;
            let id = lit
                .base10_parse::<i32>()
                .ok()
                .filter(|id| *id >= 0 && lit.suffix().is_empty())
                .ok_or_else(|| {
                    Error::new(
                        lit.span(),
                        "a device id must be a non-negative integer without a suffix, e.g. cuda(0)",
                    )
                })?;
            if !inner.is_empty() {
                return Err(inner.error("expected one device id, e.g. cuda(0)"));
            }
            Some(id)
        } else {
            None
        };
        Ok(DeviceEntry {
            name: name.to_string(),
            code,
            id,
        })
    }
}

/// `#[order(..)]`.
#[derive(Clone, Copy)]
pub enum Order {
    C,
    F,
    Contiguous,
}

/// The annotations of one parameter.
#[derive(Default)]
pub struct Annotations {
    pub shape: Option<Vec<Dim>>,
    pub devices: Option<Vec<DeviceEntry>>,
    pub order: Option<Order>,
    /// `#[dtype(..)]`: names of the dtype table's `rust` column, checked.
    pub dtypes: Option<Vec<Ident>>,
    /// `#[noconvert]`.
    pub noconvert: bool,
    /// The first annotation, for "not an array parameter" errors.
    pub first: Option<Attribute>,
    /// The `#[dtype(..)]` attribute, for "not a generic parameter" errors.
    pub dtype_attr: Option<Attribute>,
    /// Every annotation by name, for errors spanned on it.
    pub attrs: Vec<(&'static str, Attribute)>,
}

impl Annotations {
    /// The annotation `#[name..]`, if the parameter has it.
    pub fn attr(&self, name: &str) -> Option<&Attribute> {
        self.attrs.iter().find(|(n, _)| *n == name).map(|(_, a)| a)
    }
}

const NAMES: [&str; 5] = ["shape", "device", "order", "dtype", "noconvert"];

/// Removes dlcast's annotations from `attrs` and parses them.
pub fn take(attrs: &mut Vec<Attribute>) -> syn::Result<Annotations> {
    let mut out = Annotations::default();
    let mut errors: Option<Error> = None;
    let mut push_err = |e: Error| match &mut errors {
        Some(all) => all.combine(e),
        None => errors = Some(e),
    };
    let mut kept = Vec::with_capacity(attrs.len());
    for attr in attrs.drain(..) {
        let Some(name) = NAMES.iter().find(|n| attr.path().is_ident(n)) else {
            kept.push(attr);
            continue;
        };
        out.first.get_or_insert_with(|| attr.clone());
        out.attrs.push((name, attr.clone()));
        if let Err(e) = parse_one(name, &attr, &mut out) {
            push_err(e);
        }
    }
    *attrs = kept;
    match errors {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// The error for an attribute spelled like one of dlcast's annotations
/// (`#[shap(n)]`, `#[devices(cpu)]`): rustc would only say that it cannot
/// find it.
pub fn misspelled(attr: &Attribute) -> Option<Error> {
    let written = attr.path().get_ident()?.to_string();
    let lower = written.to_lowercase();
    let near = NAMES
        .iter()
        .chain(&["stream"])
        .find(|n| lower == **n || lower.len() >= 3 && distance(&lower, n) <= 2)?;
    let args = if ["noconvert", "stream"].contains(near) {
        ""
    } else {
        "(..)"
    };
    Some(Error::new_spanned(
        attr.path(),
        format!("unknown annotation `#[{written}]`; did you mean `#[{near}{args}]`?"),
    ))
}

/// The edit distance of two short ASCII names (insertions, deletions,
/// substitutions).
fn distance(a: &str, b: &str) -> usize {
    let b = b.as_bytes();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.bytes().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

fn duplicate(attr: &Attribute, name: &str) -> Error {
    let args = if name == "noconvert" { "" } else { "(..)" };
    Error::new(
        attr.path().span(),
        format!("duplicate #[{name}{args}] on this parameter"),
    )
}

fn parse_one(name: &str, attr: &Attribute, out: &mut Annotations) -> syn::Result<()> {
    match name {
        "shape" => {
            if out.shape.is_some() {
                return Err(duplicate(attr, name));
            }
            let dims = match &attr.meta {
                syn::Meta::List(l) => l.parse_args_with(parse_shape)?,
                _ => {
                    return Err(Error::new_spanned(
                        attr,
                        "write #[shape(..)], e.g. #[shape(n, 3)]",
                    ))
                }
            };
            out.shape = Some(dims);
        }
        "dtype" => {
            if out.dtypes.is_some() {
                return Err(duplicate(attr, name));
            }
            let list = parse_dtype_list(attr)?;
            out.dtypes = Some(list.into_iter().collect());
            out.dtype_attr = Some(attr.clone());
        }
        "noconvert" => {
            if !matches!(attr.meta, syn::Meta::Path(_)) {
                return Err(Error::new_spanned(
                    attr,
                    "write #[noconvert], without arguments",
                ));
            }
            if out.noconvert {
                return Err(duplicate(attr, name));
            }
            out.noconvert = true;
        }
        "device" => {
            if out.devices.is_some() {
                return Err(duplicate(attr, name));
            }
            if matches!(&attr.meta, syn::Meta::List(l) if l.tokens.is_empty()) {
                return Err(Error::new_spanned(
                    attr,
                    "list at least one device, e.g. #[device(cpu)] or #[device(any)]",
                ));
            }
            let list: Punctuated<DeviceEntry, Token![,]> =
                attr.parse_args_with(Punctuated::parse_separated_nonempty)?;
            out.devices = Some(list.into_iter().collect());
        }
        _ => {
            if out.order.is_some() {
                return Err(duplicate(attr, name));
            }
            out.order = Some(parse_order(attr)?);
        }
    }
    Ok(())
}

/// The dtypes of `#[dtype(..)]`: a non-empty list of the table's names, none
/// twice.
fn parse_dtype_list(attr: &Attribute) -> syn::Result<Punctuated<Ident, Token![,]>> {
    let list: Punctuated<Ident, Token![,]> = match &attr.meta {
        syn::Meta::List(l) if !l.tokens.is_empty() => {
            l.parse_args_with(Punctuated::parse_separated_nonempty)?
        }
        _ => {
            return Err(Error::new_spanned(
                attr,
                "list the dtypes to dispatch on, e.g. #[dtype(f32, f64)]",
            ))
        }
    };
    let mut seen: Vec<String> = Vec::new();
    for id in &list {
        let s = id.to_string();
        if !DTYPES.iter().any(|d| d.rust == s) {
            let known: Vec<&str> = DTYPES.iter().map(|d| d.rust).collect();
            return Err(Error::new(
                id.span(),
                format!(
                    "unknown dtype `{id}`; expected one of: {}",
                    known.join(", ")
                ),
            ));
        }
        if seen.contains(&s) {
            return Err(Error::new(id.span(), format!("`{id}` is listed twice")));
        }
        seen.push(s);
    }
    Ok(list)
}

/// The order of `#[order(..)]`: `c`, `f` or `contiguous`.
fn parse_order(attr: &Attribute) -> syn::Result<Order> {
    let id: Ident = attr.parse_args()?;
    Ok(match id.to_string().as_str() {
        "c" | "C" => Order::C,
        "f" | "F" => Order::F,
        "contiguous" => Order::Contiguous,
        other => {
            return Err(Error::new(
                id.span(),
                format!("unknown order `{other}`; expected `c`, `f` or `contiguous`"),
            ))
        }
    })
}

/// Parses the entries of `#[shape(..)]`, refusing a second `..`.
fn parse_shape(input: ParseStream) -> syn::Result<Vec<Dim>> {
    let mut dims = Vec::new();
    let mut rest_seen = false;
    while !input.is_empty() {
        let span = input.span();
        let d: Dim = input.parse()?;
        if matches!(d, Dim::Rest) {
            if rest_seen {
                return Err(Error::new(span, "at most one `..` per shape"));
            }
            rest_seen = true;
        }
        dims.push(d);
        if input.is_empty() {
            break;
        }
        input.parse::<Token![,]>()?;
    }
    Ok(dims)
}

/// Tokens for the runtime's `DeviceSpec` list.
pub fn devices_tokens(rt: &TokenStream, devices: Option<&[DeviceEntry]>) -> TokenStream {
    let Some(devices) = devices else {
        return quote!(&[#rt::DeviceSpec::CPU]);
    };
    let items = devices.iter().map(|d| {
        let t = match d.code {
            Some(c) => quote!(::core::option::Option::Some(#c)),
            None => quote!(::core::option::Option::None),
        };
        let id = match d.id {
            Some(i) => quote!(::core::option::Option::Some(#i)),
            None => quote!(::core::option::Option::None),
        };
        quote!(#rt::DeviceSpec { device_type: #t, device_id: #id })
    });
    quote!(&[#(#items),*])
}

/// Tokens for the runtime's `Order`.
pub fn order_tokens(rt: &TokenStream, order: Option<Order>) -> TokenStream {
    match order {
        None => quote!(#rt::Order::Any),
        Some(Order::C) => quote!(#rt::Order::C),
        Some(Order::F) => quote!(#rt::Order::F),
        Some(Order::Contiguous) => quote!(#rt::Order::Contiguous),
    }
}

/// The names of the named extents among `dims`, in order of first use: the
/// runtime numbers them so (`Dim::Named(k)` is the `k`-th name).
pub fn dim_names<'a>(dims: impl IntoIterator<Item = &'a Dim>) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for d in dims {
        if let Dim::Named(id) = d {
            let s = id.to_string();
            if !names.contains(&s) {
                names.push(s);
            }
        }
    }
    names
}

/// Tokens for the runtime's optional shape, naming each named extent by its
/// number in `dim_names` (see [`dim_names`]).
pub fn shape_tokens(rt: &TokenStream, shape: Option<&[Dim]>, dim_names: &[String]) -> TokenStream {
    let Some(dims) = shape else {
        return quote!(::core::option::Option::None);
    };
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
