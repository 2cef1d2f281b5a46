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
//!
//! Depth alone does not bound the work: where each level runs the
//! argument's code more than once (a metaclass `__module__` read both by
//! the import and by `Framework::of`), a runaway recursion branches, and 64
//! levels of two branches would take 2^64 calls. So once the bound is hit
//! the thread is *tripped*: every `enter` fails at once until the outermost
//! level has returned, and the whole tree unwinds in linear time.

use std::cell::Cell;

use pyo3::PyErr;

use crate::error::CallError;

/// How many phase-1 steps that may run Python code may be active at once
/// on one thread, the outermost call's included. No real producer nests at
/// all; 64 levels of the driver fit any thread's stack with room to spare
/// (the smallest seen, a debug build, used about 30 KiB a level).
pub(super) const MAX_DEPTH: u32 = 64;

/// The bit of the thread's count that says the bound was hit (see the
/// module docs); the levels are the bits below it.
const TRIPPED: u32 = 1 << 31;

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
            if n < MAX_DEPTH {
                // Below the bound and not tripped (the bit would make `n`
                // larger than the bound).
                d.set(n + 1);
                Some(())
            } else {
                d.set(n | TRIPPED);
                None
            }
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
        // The outermost level's return clears the trip.
        let _ = DEPTH.try_with(|d| {
            let levels = (d.get() & !TRIPPED).saturating_sub(1);
            d.set(if levels == 0 {
                0
            } else {
                levels | (d.get() & TRIPPED)
            });
        });
    }
}
