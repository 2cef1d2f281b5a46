//! Analysis: sorts a function's parameters into array parameters, plain
//! parameters and type parameters, checking every annotation against the
//! parameter's type; all errors are reported together.

use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{quote, ToTokens};
use syn::ext::IdentExt;
use syn::{Attribute, Error, FnArg, GenericParam, Ident, Pat, PatType, Signature, Type};

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
    let mut errors: Option<Error> = None;
    let tparams = type_params(sig, &mut errors);
    let mut walk = ParamWalk {
        a: Analysis {
            views: Vec::new(),
            tparams,
            outer_params: Vec::new(),
            call_args: Vec::new(),
            py_params: Vec::new(),
            has_receiver: false,
            stream_param: None,
        },
        errors,
        is_classmethod: has_attr(attrs, "classmethod"),
        first_typed: true,
        first_plain: true,
        pass_module: pysig::scan_pyo3_attrs(attrs).pass_module,
    };
    for arg in &sig.inputs {
        match arg {
            FnArg::Receiver(r) => walk.receiver(r),
            FnArg::Typed(pt) => {
                if let Err(e) = walk.typed(pt) {
                    combine(&mut walk.errors, e);
                }
            }
        }
    }

    // After an error in the parameters, a missing `#[dtype]` is most likely
    // its consequence: report only the first.
    if let Some(e) = walk.errors {
        return Err(e);
    }
    check_dtypes_listed(&walk.a.tparams)?;
    Ok(walk.a)
}

/// The function's type parameters (each a dtype it dispatches on); a const
/// parameter is an error.
fn type_params(sig: &Signature, errors: &mut Option<Error>) -> Vec<TypeParam> {
    let mut tparams: Vec<TypeParam> = Vec::new();
    for g in &sig.generics.params {
        match g {
            GenericParam::Type(tp) => tparams.push(TypeParam {
                ident: tp.ident.clone(),
                dtypes: Vec::new(),
                decided_by: None,
            }),
            GenericParam::Const(c) => combine(
                errors,
                Error::new_spanned(c, "#[dlpack_fn] functions cannot have const parameters"),
            ),
            GenericParam::Lifetime(_) => {}
        }
    }
    tparams
}

/// Every type parameter needs a parameter whose `#[dtype(..)]` lists its
/// dtypes: the errors for those without.
fn check_dtypes_listed(tparams: &[TypeParam]) -> syn::Result<()> {
    let mut errors: Option<Error> = None;
    for tp in tparams {
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
    errors.map_or(Ok(()), Err)
}

/// The walk over a function's parameters, in order: what is collected so
/// far, and what depends on the position (the first typed parameter of a
/// classmethod is `cls`, the first plain one may be a receiver or the
/// module).
struct ParamWalk {
    a: Analysis,
    errors: Option<Error>,
    is_classmethod: bool,
    first_typed: bool,
    /// The first non-array parameter: a `slf: PyRef<'_, Self>` receiver, or
    /// the module under `#[pyo3(pass_module)]`.
    first_plain: bool,
    pass_module: bool,
}

impl ParamWalk {
    /// `self`, `&self`, `&mut self`: passed through to the body.
    fn receiver(&mut self, r: &syn::Receiver) {
        self.a.outer_params.push(quote!(#r));
        self.a.call_args.push(quote!(self));
        self.a.has_receiver = true;
    }

    /// One typed parameter: its dlcast attributes taken off, then sorted by
    /// its type into an array parameter or a plain one. An error skips the
    /// parameter (the others are still checked).
    fn typed(&mut self, pt: &PatType) -> syn::Result<()> {
        let is_cls = self.is_classmethod && std::mem::take(&mut self.first_typed);
        let mut attrs = pt.attrs.clone();
        let stream_attr = stream::take_attr(&mut attrs)?;
        let annots = annot::take(&mut attrs)?;
        if let Some(e) = attrs.iter().find_map(annot::misspelled) {
            return Err(e);
        }
        match view_kind_of(&pt.ty) {
            None => self.plain(pt, &attrs, &annots, stream_attr, is_cls),
            Some((optional, inner, kind)) => {
                if let Some(attr) = &stream_attr {
                    return Err(stream::on_view_error(attr));
                }
                let view = ViewType {
                    optional,
                    inner,
                    kind,
                };
                self.view(pt, &attrs, annots, view)
            }
        }
    }

    /// A parameter that is no array: passed through as PyO3 extracts it
    /// (annotations refused, a type parameter refused, `#[stream]` recorded),
    /// and shown in the signature line unless Python does not pass it.
    fn plain(
        &mut self,
        pt: &PatType,
        attrs: &[Attribute],
        annots: &Annotations,
        stream_attr: Option<Attribute>,
        is_cls: bool,
    ) -> syn::Result<()> {
        if let Some(attr) = &annots.first {
            return Err(Error::new_spanned(
                attr,
                "#[shape], #[device], #[order], #[dtype] and #[noconvert] apply to \
                 array parameters only: TensorRef, TensorMut, TensorDyn, TensorDynMut, \
                 &[T], &mut [T], ndarray's ArrayView / ArrayViewMut (ArrayView2, \
                 ArrayViewD, ..), or an Option of one",
            ));
        }
        if let Some(tp) = self
            .a
            .tparams
            .iter()
            .find(|tp| mentions(pt.ty.to_token_stream(), &tp.ident))
        {
            return Err(Error::new_spanned(
                &pt.ty,
                format!(
                    "type parameter `{}` may only be the element type of array \
                     parameters (the dtype of the argument decides it)",
                    tp.ident
                ),
            ));
        }
        if let Some(attr) = stream_attr {
            stream::record(&mut self.a.stream_param, attr, pt)?;
        }

        let ty = &pt.ty;
        // The exported function binds the plain name (`mut k` is the
        // body's business); other patterns pass through.
        let pat = match &*pt.pat {
            Pat::Ident(pi) if pi.subpat.is_none() => pi.ident.to_token_stream(),
            other => other.to_token_stream(),
        };
        self.a.outer_params.push(quote!(#(#attrs)* #pat: #ty));
        self.a.call_args.push(pat);

        let is_python = matches!(ungroup(ty), Type::Path(p) if p.path.segments.last().is_some_and(|s| s.ident == "Python"));
        let is_self = self.first_plain
            && mentions(ty.to_token_stream(), &Ident::new("Self", Span::call_site()));
        let is_module = self.first_plain && self.pass_module;
        if is_self {
            self.a.has_receiver = true;
        }
        self.first_plain = false;
        if !is_python && !is_cls && !is_self && !is_module {
            if let Pat::Ident(pi) = &*pt.pat {
                self.a.py_params.push((
                    pi.ident.unraw().to_string(),
                    pysig::python_type(ty, "typing.Any", None),
                ));
            }
        }
        Ok(())
    }

    /// An array parameter: named plainly, its `#[dtype(..)]` bound to its
    /// type parameter, its annotations checked against its type; the
    /// exported function takes the Python object.
    fn view(
        &mut self,
        pt: &PatType,
        attrs: &[Attribute],
        annots: Annotations,
        view: ViewType<'_>,
    ) -> syn::Result<()> {
        let ViewType {
            optional,
            inner,
            kind,
        } = view;
        if let Some(e) = named_lifetime(inner) {
            return Err(e);
        }
        let Pat::Ident(pi) = &*pt.pat else {
            return Err(Error::new_spanned(
                &pt.pat,
                "an array parameter needs a plain name, e.g. `x: TensorRef<'_, f32>`",
            ));
        };
        let ident = pi.ident.clone();
        let tparam = element_type(inner).and_then(|t| match t {
            Type::Path(p) if p.qself.is_none() => {
                let id = p.path.get_ident()?;
                self.a.tparams.iter().position(|tp| tp.ident == *id)
            }
            _ => None,
        });
        self.bind_dtypes(&annots, tparam, optional);
        let shape = check_type_annotations(inner, kind, &annots)?;

        // The view borrows the call context, not the argument: the outer
        // function takes any lifetime.
        let rt = quote!(::dlcast_runtime::__private);
        let pyo3 = quote!(#rt::pyo3);
        let obj = quote!(&#pyo3::Bound<'_, #pyo3::PyAny>);
        self.a.outer_params.push(if optional {
            quote!(#(#attrs)* #ident: ::core::option::Option<#obj>)
        } else {
            quote!(#(#attrs)* #ident: #obj)
        });
        self.a.call_args.push(quote!(#ident));
        self.first_plain = false;
        self.a.py_params.push((ident.unraw().to_string(), None));
        self.a.views.push(ViewParam {
            ident,
            ty: inner.clone(),
            optional,
            kind,
            annots,
            shape,
            tparam,
        });
        Ok(())
    }

    /// `#[dtype(..)]` on the next array parameter: its list becomes the
    /// dtypes of its element type's type parameter, which this parameter
    /// then decides. Errors (no type parameter, listed twice, an optional
    /// parameter) are collected; the parameter is still analysed.
    fn bind_dtypes(&mut self, annots: &Annotations, tparam: Option<usize>, optional: bool) {
        let Some(list) = &annots.dtypes else {
            return;
        };
        let index = self.a.views.len();
        let attr = annots.dtype_attr.as_ref().expect("set with dtypes");
        let Some(k) = tparam else {
            combine(
                &mut self.errors,
                Error::new_spanned(
                    attr,
                    "#[dtype(..)] lists the dtypes a type parameter dispatches on; use it \
                     on a parameter whose element type is a type parameter of the \
                     function, e.g. `#[dtype(f32, f64)] x: TensorRef<'_, T>`",
                ),
            );
            return;
        };
        let tp = &mut self.a.tparams[k];
        if let Some(other) = tp.decided_by {
            let other = &self.a.views[other].ident;
            combine(
                &mut self.errors,
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
                &mut self.errors,
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

/// What [`view_kind_of`] reads from an array parameter's type.
struct ViewType<'t> {
    optional: bool,
    inner: &'t Type,
    kind: ViewKind,
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
