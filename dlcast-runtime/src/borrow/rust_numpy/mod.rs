//! Working together with rust-numpy's borrow checking.
//!
//! rust-numpy (the `numpy` crate) checks its `PyReadonlyArray` and
//! `PyReadwriteArray` borrows at run time, in a registry that its extensions
//! share through a capsule named [`ATTR`], in the attribute of the same name
//! of NumPy's `multiarray` module (`numpy._core.multiarray` under NumPy 2,
//! `numpy.core.multiarray` before). The capsule holds a C struct
//! ([`table::Shared`]): its version first (1; later versions may only append
//! fields), an opaque `flags` pointer and four functions, `acquire`,
//! `acquire_mut`, `release` and `release_mut`, each passed `flags` and a
//! `PyArrayObject*`, called with the GIL held; the acquiring ones return 0
//! (granted), -1 (in use) or -2 (not writeable). Each rust-numpy extension
//! uses the first capsule it finds there, and publishes its own if there is
//! none, when it first borrows an array.
//!
//! dlcast looks there in phase 1 of every call that reads an exact
//! `numpy.ndarray` from its fields ([`check`]: look-ups in `sys.modules`,
//! in the module's dictionary and in the classes `module` and `object`,
//! each compared by identity, skipped while no dictionary changed since
//! the last look-up by its PEP 509 version tag; no Python code), and again
//! in phase 2, after the last step of the call that can run Python code
//! ([`in_place`]: with version tags only loads and compares, and back to
//! phase 1 when a dictionary changed), as every `ArrayBuffer` access does
//! before it touches memory exported arrays share ([`foreign_in_use`]). The
//! module is NumPy's `multiarray` of NumPy's ABI version, read from
//! NumPy's verified C API table ([`crate::npapi::table`]), never from
//! `numpy.__version__`, which also decides the dtype layout dlcast's table
//! reads. The first time (already when the registry is set up, at the first
//! call of any dlcast function in the process, if NumPy is imported by
//! then: [`set_up`]):
//!
//! - **No capsule yet**: dlcast publishes one whose functions enter
//!   rust-numpy's borrows in dlcast's own registry (see [`super`]), with
//!   `flags` pointing to that registry's [`super::BorrowApi`], by which every
//!   dlcast build recognises it. From then on there is one registry for
//!   both, and a dlcast call pays only the check.
//! - **A capsule of rust-numpy's**: every view dlcast makes of an exact
//!   `numpy.ndarray` is also acquired there ([`pre_hold`]), read or write as
//!   the view, and released when the view's borrow ends ([`release`]). The
//!   holds sit in a table of this extension keyed by the dlcast borrow's id
//!   (the view's own layout is unchanged: the NumPy path pays one atomic
//!   load when it reads and one when it drops).
//!
//! Not covered in the second case: subclasses of `numpy.ndarray`, arrays
//! read through `__dlpack__`, and memory reached through other producers
//! (rust-numpy does not see those either). In the first case rust-numpy's
//! borrows are compared by memory with every view in the registry.
//!
//! rust-numpy's functions are called by dlcast only for tables it verified
//! ([`table`]); where rust-numpy looks, and what dlcast accepts there, is
//! [`place`]'s; what dlcast does when Python code changed it, [`recheck`]'s.
//!
//! The parts:
//!
//! - [`table`]: rust-numpy's C struct, the verification of a table, and
//!   the foreign tables dlcast adopted ([`foreign`]);
//! - [`place`]: where rust-numpy looks (NumPy's module, `sys.modules`, the
//!   other major version's module) and the C-level look-ups there;
//! - [`seen`]: the version tags that let a call skip those look-ups;
//! - [`checks`]: the per-call checks, phase 1 ([`check`]) and phase 2
//!   ([`in_place`]);
//! - [`recheck`]: the slow path, when a dictionary changed or the first
//!   time: putting back, publishing, adopting or refusing;
//! - [`published`]: dlcast's own table, entering rust-numpy's borrows in
//!   dlcast's registry;
//! - [`hold`]: dlcast's views held in foreign tables.

mod checks;
mod hold;
mod place;
mod published;
mod recheck;
mod seen;
mod table;

pub(crate) use checks::{check, foreign_in_use, in_place, ready, set_up};
pub(crate) use hold::{pre_hold, release, PreHold};
pub(crate) use table::foreign;

use pyo3::prelude::*;
use std::ffi::CStr;

/// The capsule's name, and the attribute of NumPy's `multiarray` module
/// that holds it.
const ATTR: &CStr = c"_RUST_NUMPY_BORROW_CHECKING_API";
/// [`ATTR`] as text.
const ATTR_NAME: &str = "_RUST_NUMPY_BORROW_CHECKING_API";

/// The function name recorded for rust-numpy's borrows in dlcast's
/// registry (no Rust function has this name).
pub(crate) const RUST_NUMPY: &str = "<rust-numpy>";

/// The error for NumPy arrays while rust-numpy's table cannot be followed.
fn refusal(why: std::fmt::Arguments<'_>) -> PyErr {
    crate::error::RegistryError::RustNumpyUnseen(why.to_string()).into()
}
