//! What tests of the call driver switch and observe, in debug builds: the
//! NumPy fast path's switch and count ([`numpy_fast_path`]), and the
//! tripwire that marks the raw reads ([`raw_reads_in_progress`]). Release
//! builds always take the fast path and track nothing.

/// The fast path's switch and count, for tests that run the same inputs
/// through it and through the general path ([`numpy_fast_path`]): debug
/// builds only; release builds always take it and count nothing.
pub(super) mod fast_switch {
    #[cfg(debug_assertions)]
    pub(in crate::call) static OFF: std::sync::atomic::AtomicBool =
        std::sync::atomic::AtomicBool::new(false);
    #[cfg(debug_assertions)]
    pub(in crate::call) static TAKEN: std::sync::atomic::AtomicU64 =
        std::sync::atomic::AtomicU64::new(0);

    /// Whether `prepare` may leave exact NumPy arrays to the fast path.
    #[inline(always)]
    pub(in crate::call) fn on() -> bool {
        #[cfg(debug_assertions)]
        return !OFF.load(std::sync::atomic::Ordering::Relaxed);
        #[cfg(not(debug_assertions))]
        true
    }

    /// Counts a call whose arguments the fast path read.
    #[inline(always)]
    pub(in crate::call) fn taken() {
        #[cfg(debug_assertions)]
        TAKEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// For tests: in debug builds, turns the fast path for exact NumPy arrays
/// off (`Some(false)`) or on (`Some(true)`, the default), or leaves it
/// (`None`), and returns how many calls it completed in the process so
/// far; `None` in release builds, which always take it.
#[doc(hidden)]
pub fn numpy_fast_path(on: Option<bool>) -> Option<u64> {
    #[cfg(debug_assertions)]
    {
        use std::sync::atomic::Ordering;
        if let Some(on) = on {
            fast_switch::OFF.store(!on, Ordering::Relaxed);
        }
        Some(fast_switch::TAKEN.load(Ordering::Relaxed))
    }
    #[cfg(not(debug_assertions))]
    {
        let _ = on;
        None
    }
}

/// Debug builds only: marks the stretch of phase 2 where arguments are
/// read, so that tests can call Python code from every hook dlcast
/// consults and check that none of it runs there
/// ([`raw_reads_in_progress`]).
#[cfg(debug_assertions)]
pub(super) mod tripwire {
    use std::cell::Cell;

    thread_local! {
        static ACTIVE: Cell<bool> = const { Cell::new(false) };
    }

    /// Inside a read pass while alive (restores the previous state on drop).
    pub(in crate::call) struct Reads(bool);

    impl Reads {
        pub(in crate::call) fn enter() -> Self {
            Reads(ACTIVE.with(|a| a.replace(true)))
        }
    }

    impl Drop for Reads {
        fn drop(&mut self) {
            ACTIVE.with(|a| a.set(self.0));
        }
    }

    pub(in crate::call) fn active() -> bool {
        ACTIVE.with(Cell::get)
    }
}

/// Whether this thread is reading a `#[dlpack_fn]` call's arguments (phase
/// 2, from the first raw read to the last check), where no Python code may
/// run: `Some(..)` in debug builds, `None` in release builds, which do not
/// track it. For tests: Python code that dlcast may reach (a producer's
/// methods, a replaced attribute) asks it and records a `Some(true)`.
#[doc(hidden)]
pub fn raw_reads_in_progress() -> Option<bool> {
    #[cfg(debug_assertions)]
    return Some(tripwire::active());
    #[cfg(not(debug_assertions))]
    None
}
