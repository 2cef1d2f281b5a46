//! The lazy bits of a tensor (negative, conjugate, zero) and whether it
//! is an inference tensor, read from PyTorch's dispatch key set where its
//! layout could be learnt and verified ([`KeySet`]); the parent module
//! asks PyTorch's own methods where it could not.

#[allow(unused_imports)]
use super::*;

/// Where a tensor's dispatch key set lies in memory, and which of its bits
/// are the lazy bits: PyTorch's C-level state, read instead of asking
/// `is_neg()`, `is_conj()`, `_is_zerotensor()` and `is_inference()` (C
/// methods that release and retake the GIL, the largest cost of a call).
///
/// PyTorch promises no layout, so none is assumed: it would have to be
/// learnt at first use by [`KeySet::probe`] from tensors Python code
/// cannot choose, which it does not do yet (see there), so there is no
/// `KeySet` and the methods are asked.
#[derive(Clone, Copy, Debug)]
pub(super) struct KeySet {
    /// Byte offset, in a `TensorBase` instance, of its `TensorImpl *`.
    impl_at: usize,
    /// Byte offset, in a `TensorImpl`, of its `DispatchKeySet` (one word).
    keys_at: usize,
    /// The `Negative`, `Conjugate` and `ZeroTensor` bits.
    neg: u64,
    conj: u64,
    zero: u64,
    /// The bits a normal tensor has and an inference tensor lacks
    /// (`ADInplaceOrView` and autograd's): `is_inference()` is true when
    /// none of them is set.
    tracked: u64,
}

/// What [`KeySet::probe`] found, once (see [`keys`]).
static KEYS: pyo3::sync::PyOnceLock<Option<KeySet>> = pyo3::sync::PyOnceLock::new();

/// The learnt layout, probed the first time (phase 1); `None` when the
/// probe did not find one it trusts (for now, always).
pub(super) fn keys(py: Python<'_>, h: &'static Handles) -> Option<KeySet> {
    *KEYS.get_or_init(py, || {
        let found = KeySet::probe(py, h);
        // A probe that failed half-way leaves no error behind.
        drop(PyErr::take(py));
        found
    })
}

/// Whether the lazy bits are read from PyTorch's C-level state (`Some`
/// once the first PyTorch argument was prepared), for tests.
#[doc(hidden)]
pub fn reads_key_set(py: Python<'_>) -> Option<bool> {
    KEYS.get(py).map(Option::is_some)
}

impl KeySet {
    /// Learns the layout (see [`KeySet`]): for now, never (`None`), so the
    /// methods are asked.
    ///
    /// The probe that was here made its tensors by running Python code
    /// (`torch.ones`, `torch._neg_view`, `torch._efficientzerotensor`,
    /// slicing, `.conj()`, `torch.inference_mode`), all attributes Python
    /// code can replace: real tensors whose sizes were chosen so that an
    /// inline size word differed like the key bits taught it that word as
    /// the key set (a negative view read as plain, a sliced zero tensor
    /// dereferenced). PyTorch's own answers cannot catch that, as each
    /// tensor really is what it says.
    ///
    /// What would make it sound again: every probe tensor made from Rust,
    /// with fixed arguments, by builtins checked by identity against
    /// PyTorch's image (`crate::trust::is_builtin`, as in `handles`:
    /// `torch._C._VariableFunctions`' `ones`, `narrow`, `_neg_view`,
    /// `conj`, `_efficientzerotensor`; the inference tensor under a
    /// verified static context type, or the inference bit left to
    /// `is_inference()`), with Python dispatch modes off
    /// (`_DisableTorchDispatch`), AND each tensor's shape, strides and
    /// storage offset checked, through verified getters, to be exactly
    /// what was asked (the same small shape for all, so no size word can
    /// mimic a key bit; a Python kernel registered for an operator could
    /// still return any tensor). Until then the key set is not read.
    fn probe(_py: Python<'_>, _h: &'static Handles) -> Option<KeySet> {
        None
    }

    /// The key set of `obj`, a live instance of `TensorBase` (the caller
    /// checked its type); `None` if it holds no `TensorImpl`.
    pub(super) fn read(&self, obj: &Bound<'_, PyAny>) -> Option<u64> {
        // SAFETY: `obj` is a `TensorBase` instance, whose C struct holds
        // its `TensorImpl *` at `impl_at` (learnt by `probe` within the
        // struct's C size, and the same for every instance of the type and
        // its subclasses); word aligned.
        let tensor = unsafe {
            std::ptr::read(
                obj.as_ptr()
                    .cast::<u8>()
                    .add(self.impl_at)
                    .cast::<*const u8>(),
            )
        };
        if tensor.is_null() {
            return None;
        }
        // SAFETY: `tensor` is the live `TensorImpl` of `obj` (which the
        // caller holds; a tensor keeps its `TensorImpl`); its key set is the
        // aligned word at `keys_at` (learnt by `probe`, the same for every
        // `TensorImpl`, whatever its subclass). The GIL is held and no
        // PyTorch call runs on this thread.
        Some(unsafe { std::ptr::read(tensor.add(self.keys_at).cast::<u64>()) })
    }

    /// The lazy bits in a key set (`conjugate` whatever the dtype).
    pub(super) fn bits(&self, keys: u64) -> Lazy {
        Lazy {
            negative: keys & self.neg != 0,
            conjugate: keys & self.conj != 0,
            zero: keys & self.zero != 0,
        }
    }

    /// `is_inference()` of a key set.
    pub(super) fn inference(&self, keys: u64) -> bool {
        keys & self.tracked == 0
    }
}
