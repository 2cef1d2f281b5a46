//! The array frameworks dlcast knows by name: where an argument comes from
//! (`returns = like(param)`, conversions) and where results go
//! (`returns = ...`). The enum and every fact about each framework are
//! rows of the framework table ([`crate::facts::FRAMEWORKS`]).

use pyo3::intern;
use pyo3::prelude::*;

pub use crate::facts::Framework;
use crate::facts::FRAMEWORKS;

impl Framework {
    /// The framework whose array `obj` is, judged by the top-level package
    /// of its type (`numpy`, `torch`, `jax`/`jaxlib`, ...: the `modules`
    /// column of the framework table); `None` for anything else (buffers,
    /// capsules, `dlcast.Array`). Used by `returns = like(param)`.
    ///
    /// The look-up may run Python code (a metaclass's `__module__`), which
    /// may call dlcast again: it counts as one level of the driver's nesting
    /// bound, and past it the answer is `None` (the nested call itself is
    /// then refused with `RecursionError`, by its own phase 1).
    pub fn of(obj: &Bound<'_, PyAny>) -> Option<Framework> {
        let _nested = crate::call::depth::Nested::enter("Framework::of").ok()?;
        let py = obj.py();
        let module = obj.get_type().getattr(intern!(py, "__module__")).ok()?;
        let module = module.extract::<pyo3::pybacked::PyBackedStr>().ok()?;
        let top = module.split('.').next().unwrap_or("");
        FRAMEWORKS
            .iter()
            .find(|f| f.modules.contains(&top))
            .map(|f| f.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_variant_is_its_row() {
        for (i, f) in FRAMEWORKS.iter().enumerate() {
            assert_eq!(f.id as usize, i);
            assert_eq!(f.id.facts().option, f.option);
        }
        // A package belongs to one framework at most.
        let mut modules: Vec<&str> = FRAMEWORKS.iter().flat_map(|f| f.modules).copied().collect();
        let n = modules.len();
        modules.sort_unstable();
        modules.dedup();
        assert_eq!(modules.len(), n);
    }
}
