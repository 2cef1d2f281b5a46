//! The constraints of a `#[dlpack_fn]` function, as the macro writes them:
//! one `static` [`FnSpec`] per function, one [`ParamSpec`] per array
//! parameter (nanobind's "all annotations fold into one config value").

use crate::device::DeviceSpec;
use std::fmt;

/// One entry of `#[shape(..)]`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Dim {
    /// An integer: the extent must equal it.
    Fixed(usize),
    /// `_`: any extent.
    Any,
    /// An identifier: index into [`FnSpec::dim_names`]; every parameter of
    /// the call that uses the name must have the same extent there.
    Named(u8),
    /// `..`: any number of dimensions (at most one per shape).
    Rest,
}

/// `#[order(..)]`: the memory order a parameter requires.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Order {
    /// No `#[order]`: any strides.
    Any,
    /// `#[order(c)]`: C-contiguous (row-major).
    C,
    /// `#[order(f)]`: F-contiguous (column-major).
    F,
    /// `#[order(contiguous)]`: C- or F-contiguous.
    Contiguous,
}

impl Order {
    /// The annotation's spelling, as shown in error messages.
    pub fn describe(self) -> &'static str {
        match self {
            Order::Any => "any order",
            Order::C => "C-contiguous (order c)",
            Order::F => "F-contiguous (order f)",
            Order::Contiguous => "C- or F-contiguous (order contiguous)",
        }
    }
}

/// The constraints of one array parameter.
#[derive(Debug)]
pub struct ParamSpec {
    /// The parameter's name (as Python callers spell it as a keyword).
    pub name: &'static str,
    /// `#[shape(..)]`, or `None` for any shape.
    pub shape: Option<&'static [Dim]>,
    /// `#[device(..)]`; the default is `[DeviceSpec::CPU]`.
    pub devices: &'static [DeviceSpec],
    /// `#[order(..)]`.
    pub order: Order,
    /// Whether a read-only argument whose dtype or memory order does not
    /// fit may be converted by its own framework (see
    /// the `convert` module); `false` under `#[noconvert]`,
    /// `#[dlpack_fn(noconvert)]`, and for writable or dtype-generic
    /// parameters.
    pub convert: bool,
    /// Whether the parameter's type hands out Rust references to the
    /// elements (`&[T]`, an `ndarray` view, `TensorRef`/`TensorMut` under
    /// `#[order(..)]`): the data must then be aligned for the element type
    /// (host memory is checked through `devices`). A misaligned read-only
    /// argument converts (a fresh copy is aligned); a writable one is refused.
    /// The checks also align the host memory of every typed view
    /// (`TensorRef`/`TensorMut` without `#[order]` too), whose accessors
    /// hand out references.
    pub aligned: bool,
    /// For the parameter that carries `#[dtype(..)]` in a dtype-generic
    /// function: the accepted dtypes, in the order listed. Empty otherwise.
    pub dtypes: &'static [crate::dtype::DType],
    /// For a parameter whose element type is a type parameter decided by
    /// another parameter's dtype: that type parameter and parameter.
    pub shares_dtype: Option<SharedDType>,
}

/// A type parameter of a dtype-generic function, shared by several array
/// parameters: all must have the dtype of the one that decides it.
#[derive(Debug, Clone, Copy)]
pub struct SharedDType {
    /// The type parameter's name, e.g. `"T"`.
    pub type_param: &'static str,
    /// Index (into [`FnSpec::params`]) of the parameter whose dtype decides it.
    pub decided_by: u8,
}

/// The constraints of one `#[dlpack_fn]` function.
#[derive(Debug)]
pub struct FnSpec {
    /// The function's Rust name, used in every error message (`name(): ...`).
    pub name: &'static str,
    /// Names of the named extents used by any parameter, in order of first use.
    pub dim_names: &'static [&'static str],
    /// The array parameters, in the order the macro passes them.
    pub params: &'static [ParamSpec],
}

/// Displays a `#[shape(..)]` as Python shows shapes: `(n, 3)`, `(n,)`, `()`.
pub(crate) struct ShapeDisplay<'a> {
    pub dims: &'a [Dim],
    pub names: &'a [&'a str],
}

impl fmt::Display for ShapeDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("(")?;
        for (i, d) in self.dims.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            match d {
                Dim::Fixed(n) => write!(f, "{n}")?,
                Dim::Any => f.write_str("_")?,
                Dim::Named(k) => f.write_str(self.names.get(*k as usize).unwrap_or(&"?"))?,
                Dim::Rest => f.write_str("...")?,
            }
        }
        if self.dims.len() == 1 {
            f.write_str(",")?;
        }
        f.write_str(")")
    }
}

/// Displays a concrete shape or strides as a Python tuple.
pub(crate) struct TupleDisplay<'a, T>(pub &'a [T]);

impl<T: fmt::Display> fmt::Display for TupleDisplay<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("(")?;
        for (i, x) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{x}")?;
        }
        if self.0.len() == 1 {
            f.write_str(",")?;
        }
        f.write_str(")")
    }
}

/// Matches `shape` against `dims`, calling `bind(name_index, axis)` for each
/// named extent. Returns `false` if the number of dimensions or a fixed
/// extent does not fit.
pub(crate) fn match_shape(
    dims: &[Dim],
    shape: &[usize],
    mut bind: impl FnMut(u8, usize) -> bool,
) -> bool {
    let mut fits = |d: &Dim, n: usize| match *d {
        Dim::Fixed(want) => want == n,
        Dim::Any | Dim::Rest => true,
        Dim::Named(k) => bind(k, n),
    };
    let Some(rest) = dims.iter().position(|d| *d == Dim::Rest) else {
        // The common case: one extent per dimension.
        return shape.len() == dims.len() && dims.iter().zip(shape).all(|(d, &n)| fits(d, n));
    };
    let (head, tail) = (&dims[..rest], &dims[rest + 1..]);
    if shape.len() < head.len() + tail.len() {
        return false;
    }
    let tail_start = shape.len() - tail.len();
    head.iter().zip(shape).all(|(d, &n)| fits(d, n))
        && tail
            .iter()
            .zip(&shape[tail_start..])
            .all(|(d, &n)| fits(d, n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_display_like_python() {
        let names = ["n"];
        let s = |dims: &[Dim]| {
            ShapeDisplay {
                dims,
                names: &names,
            }
            .to_string()
        };
        assert_eq!(s(&[Dim::Named(0), Dim::Fixed(3)]), "(n, 3)");
        assert_eq!(s(&[Dim::Named(0)]), "(n,)");
        assert_eq!(s(&[]), "()");
        assert_eq!(s(&[Dim::Rest, Dim::Any]), "(..., _)");
        assert_eq!(TupleDisplay(&[5usize, 4]).to_string(), "(5, 4)");
        assert_eq!(TupleDisplay(&[5usize]).to_string(), "(5,)");
    }

    #[test]
    fn rest_matches_any_number_of_leading_dims() {
        let dims = [Dim::Rest, Dim::Fixed(3)];
        assert!(match_shape(&dims, &[3], |_, _| true));
        assert!(match_shape(&dims, &[7, 2, 3], |_, _| true));
        assert!(!match_shape(&dims, &[], |_, _| true));
        assert!(!match_shape(&dims, &[3, 4], |_, _| true));
        assert!(match_shape(&[], &[], |_, _| true));
        assert!(!match_shape(&[], &[1], |_, _| true));
    }

    #[test]
    fn named_extents_are_reported() {
        let mut seen = vec![];
        assert!(match_shape(
            &[Dim::Named(0), Dim::Rest, Dim::Named(1)],
            &[4, 9, 9, 2],
            |k, n| {
                seen.push((k, n));
                true
            }
        ));
        assert_eq!(seen, vec![(0, 4), (1, 2)]);
    }
}
