//! Release of what a call holds: the owners (producer deleters, buffer
//! releases: Python code) of views dropped while a body runs are held back
//! to the body's end ([`BodyGuard`]), so that dropping one view runs no
//! Python code while the body holds slices of others; a call context that
//! ends releases its own at once ([`undeferred`]).
//!
//! `RawTensor`'s `Drop` is here, not in `import`: when an import's owner is
//! released is the call's lifecycle, and keeping it here leaves `import`
//! free of any use of the call driver.

use super::{ArgSlot, CallContext};
use crate::import::{Owner, RawTensor};

impl Drop for RawTensor {
    /// Releases the memory (the producer's deleter, `PyBuffer_Release`, a
    /// reference drop: Python code), unless a body is running: then the
    /// owner waits for the body to return (see [`BodyGuard`]), so that
    /// dropping one view inside a body runs no Python code while the body
    /// holds slices of other views.
    fn drop(&mut self) {
        // Only a producer's deleter and a buffer's release run foreign code.
        // A NumPy array or PyTorch alias reference is not the last one
        // (the caller's arguments hold theirs; a converted temporary is
        // held by the call), and dropping the alias runs no Python code.
        if !self.defers_release() {
            return;
        }
        let owner = std::mem::replace(&mut self.owner, Owner::None);
        let owner = DEFERRED.with(|d| {
            let Ok(mut frame) = d.try_borrow_mut() else {
                return Some(owner);
            };
            match frame.as_mut() {
                Some(v) => {
                    if v.try_reserve(1).is_err() {
                        return Some(owner);
                    }
                    v.push(owner);
                    None
                }
                None => Some(owner),
            }
        });
        // Dropped outside the borrow: its Python code may call dlcast again.
        drop(owner);
    }
}

thread_local! {
    /// The owners released while the innermost running body of this thread
    /// runs (`None` outside bodies).
    static DEFERRED: std::cell::RefCell<Option<Vec<Owner>>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` with owners released as they drop, even inside a body: for a
/// call context that ends (its own body has returned) inside another
/// call's body — a nested call from a callback, or a wrapper called from
/// Rust — whose own first phase ran Python code there already, so holding
/// its owners back to the outer body's end would only delay their release.
pub(crate) fn undeferred<R>(f: impl FnOnce() -> R) -> R {
    let outer = DEFERRED.with(|d| d.try_borrow_mut().map(|mut fr| fr.take()).unwrap_or(None));
    let r = f();
    if outer.is_some() {
        DEFERRED.with(|d| {
            if let Ok(mut fr) = d.try_borrow_mut() {
                *fr = outer;
            }
        });
    }
    r
}

/// Whether a body is running on this thread: owners dropped now would be
/// held back to its end (`true` as well while the frame is borrowed, which
/// only the guard's own bookkeeping does).
#[inline(always)]
pub(crate) fn in_body() -> bool {
    DEFERRED.with(|d| d.try_borrow().map_or(true, |f| f.is_some()))
}

/// While it lives (the body of a `#[dlpack_fn]` function), views that drop
/// keep their owners here; dropping the guard releases them. Nested calls
/// (a body's callback calling another dlcast function) stack.
pub(crate) struct BodyGuard {
    outer: Option<Vec<Owner>>,
}

impl BodyGuard {
    /// Starts a body.
    pub(crate) fn enter() -> BodyGuard {
        let outer = DEFERRED.with(|d| {
            d.try_borrow_mut()
                .map(|mut f| f.replace(Vec::new()))
                .unwrap_or(None)
        });
        BodyGuard { outer }
    }
}

impl Drop for BodyGuard {
    fn drop(&mut self) {
        let outer = self.outer.take();
        let mine = DEFERRED.with(|d| {
            d.try_borrow_mut()
                .map(|mut f| std::mem::replace(&mut *f, outer))
                .unwrap_or(None)
        });
        // The body has returned: its views' owners are released now.
        drop(mine);
    }
}

impl<const N: usize> Drop for CallContext<N> {
    fn drop(&mut self) {
        // The reads kept here (slices, ndarray views) and every owner not
        // handed to a view are released now, not at the end of an enclosing
        // call's body (see `release::undeferred`). Only reads whose release
        // runs a producer's code are ever held back: without one, the slots
        // drop as they are.
        let defers = self.slots.iter_mut().any(|s| {
            s.raw
                .get_mut()
                .as_ref()
                .is_some_and(RawTensor::defers_release)
        });
        if defers {
            undeferred(|| {
                for slot in &mut self.slots {
                    *slot = ArgSlot::absent();
                }
            });
        }
    }
}
