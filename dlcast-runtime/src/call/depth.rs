//! A bound on how deeply calls nest through the Python code phase 1 runs.
//!
//! Phase 1 runs producers' code (`__dlpack__`, PyTorch's methods, NumPy's
//! conversions), and that code may call a dlcast function again, whose
//! phase 1 may do the same. Python's recursion limit counts only Python
//! frames: each nested level also holds the driver's frames (tens of
//! kilobytes in a debug build), so an endless producer would overflow the
//! thread's stack — a crash — long before Python raised `RecursionError`.
//! [`Nested::enter`] counts the levels on this thread and refuses the call
//! past [`MAX_DEPTH`] with `RecursionError` instead. Besides phase 1, the
//! conversions of phase 2's passes and `Framework::of` (the default return's
//! and `like(param)`'s look-up, before phase 1) count.

use std::cell::Cell;

use pyo3::PyErr;

use crate::error::CallError;

/// How many phase-1 steps that may run Python code may be active at once
/// on one thread, the outermost call's included. No real producer nests at
/// all; 64 levels of the driver fit any thread's stack with room to spare
/// (the smallest seen, a debug build, used about 30 KiB a level).
pub(super) const MAX_DEPTH: u32 = 64;

thread_local! {
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// One level of nesting, counted while it lives.
pub(crate) struct Nested(());

impl Nested {
    /// Counts one more level on this thread.
    ///
    /// # Errors
    /// `RecursionError` past [`MAX_DEPTH`], or
    /// where the thread's count is gone (the thread is exiting).
    #[inline(always)]
    pub(crate) fn enter(func: &'static str) -> Result<Nested, PyErr> {
        let entered = DEPTH.try_with(|d| {
            let n = d.get();
            (n < MAX_DEPTH).then(|| d.set(n + 1))
        });
        match entered {
            Ok(Some(())) => Ok(Nested(())),
            _ => Err(CallError::TooDeep {
                func,
                limit: MAX_DEPTH,
            }
            .into()),
        }
    }
}

impl Drop for Nested {
    #[inline(always)]
    fn drop(&mut self) {
        // `enter` succeeded, so the count is at least 1 and still there
        // (a thread's locals outlive the frames that count in them).
        let _ = DEPTH.try_with(|d| d.set(d.get().saturating_sub(1)));
    }
}
