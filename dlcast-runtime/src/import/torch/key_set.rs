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
/// PyTorch promises no layout, so none is assumed: [`KeySet::probe`]
/// learns it at first use from tensors it makes, and keeps it only if it
/// agrees with PyTorch's own answers (`TensorBase`'s methods, checked to be
/// PyTorch's own) on every one of them; on any doubt, or under the limited
/// API (where a type's size cannot be read), there is no `KeySet` and the
/// methods are asked as before.
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

/// The number of `TensorImpl` words the probe looks at: 192 bytes, fewer
/// than the fields every `TensorImpl` has before its key set and the flags
/// after it (a vtable, reference counts, storage, autograd and extra
/// metadata, version counter, Python object slot, sizes and strides with
/// five inline dimensions (88 bytes), offset, element count, dtype,
/// device), so that every word read lies inside the object.
#[cfg(not(Py_LIMITED_API))]
const IMPL_WORDS: usize = 24;

/// The tensors the probe learns from, made by PyTorch (Python code: at
/// first use, in phase 1); each is also asked by `TensorBase`'s own methods.
#[cfg(not(Py_LIMITED_API))]
const PROBE: &std::ffi::CStr = c"
import torch
plain = torch.ones(3)
view = plain[1:]
neg = torch._neg_view(plain)
conj = torch.ones(2, dtype=torch.complex64).conj()
both = torch._neg_view(conj)
zero = torch._efficientzerotensor(3)
with torch.inference_mode():
    inference = torch.ones(3)
tensors = [plain, view, neg, conj, both, zero, inference]
";

/// What [`KeySet::probe`] found, once (see [`keys`]).
static KEYS: pyo3::sync::PyOnceLock<Option<KeySet>> = pyo3::sync::PyOnceLock::new();

/// The learnt layout, probed the first time (phase 1; Python code); `None`
/// when the probe did not find one it trusts.
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

/// A tensor's answers to `TensorBase`'s own methods, and the words the
/// probe reads of it.
#[cfg(not(Py_LIMITED_API))]
struct Probed {
    neg: bool,
    conj: bool,
    zero: bool,
    inference: bool,
    /// `TensorBase._cdata`: the address of its `TensorImpl`.
    cdata: usize,
    /// Its first [`IMPL_WORDS`] `TensorImpl` words.
    words: [u64; IMPL_WORDS],
    object: *const u8,
}

impl KeySet {
    /// Learns the layout (see [`KeySet`]); `None` on any doubt.
    #[cfg(Py_LIMITED_API)]
    fn probe(_py: Python<'_>, _h: &'static Handles) -> Option<KeySet> {
        None
    }

    /// Learns the layout (see [`KeySet`]); `None` on any doubt: the
    /// `TensorImpl *` must be the one word of the `TensorBase` struct
    /// (within its C size) that holds `_cdata` in every probe tensor, and
    /// the key set the one `TensorImpl` word whose bits, learnt from the
    /// differences between a plain tensor and its negative, conjugate,
    /// zero and inference counterparts, give every probe tensor's answers
    /// to `is_neg()`, `is_conj()`, `_is_zerotensor()` and `is_inference()`.
    #[cfg(not(Py_LIMITED_API))]
    fn probe(py: Python<'_>, h: &'static Handles) -> Option<KeySet> {
        use pyo3::ffi;
        let cdata = h.cdata.as_ref()?;
        let base = h.base.bind(py);
        // SAFETY: `base` is `TensorBase`, a static type (checked in
        // `handles`); its C size is a plain field.
        let size =
            usize::try_from(unsafe { (*base.as_ptr().cast::<ffi::PyTypeObject>()).tp_basicsize })
                .ok()?;
        // No mode or override answers for PyTorch here.
        let _off = NoTorchFunction::enter(py, h).ok()?;
        let scope = pyo3::types::PyDict::new(py);
        py.run(PROBE, Some(&scope), Some(&scope)).ok()?;
        let tensors = scope.get_item("tensors").ok()??;
        let mut probed = Vec::new();
        for t in tensors.try_iter().ok()? {
            let t = t.ok()?;
            // SAFETY: both pointers are live type objects.
            if unsafe { ffi::PyObject_TypeCheck(t.as_ptr(), base.as_ptr().cast()) } == 0 {
                return None;
            }
            let ask = |m: &Py<PyAny>| -> Option<bool> {
                let v = m.bind(py).call1((&t,)).ok()?;
                v.cast::<pyo3::types::PyBool>().ok().map(|b| b.is_true())
            };
            let address: usize = get(cdata, &t).ok()?.extract().ok()?;
            if address == 0 || address % 8 != 0 {
                return None;
            }
            let mut words = [0u64; IMPL_WORDS];
            for (i, w) in words.iter_mut().enumerate() {
                // SAFETY: `address` is the live `TensorImpl` of `t` (which
                // `tensors` holds), aligned, and has more than
                // `IMPL_WORDS` words (see `IMPL_WORDS`).
                *w = unsafe { std::ptr::read((address as *const u64).add(i)) };
            }
            probed.push(Probed {
                neg: ask(&h.is_neg)?,
                conj: ask(&h.is_conj)?,
                zero: ask(&h.is_zerotensor)?,
                inference: ask(&h.is_inference)?,
                cdata: address,
                words,
                object: t.as_ptr().cast::<u8>().cast_const(),
            });
        }
        let [plain, _, neg, conj, _, zero, inference] = probed.as_slice() else {
            return None;
        };
        if plain.neg || plain.conj || plain.zero || plain.inference {
            return None;
        }
        // The `TensorImpl *`: one word of the `TensorBase` struct, past the
        // object header, within its C size.
        let header = std::mem::size_of::<ffi::PyObject>();
        let at: Vec<usize> = (header..size.saturating_sub(7))
            .step_by(8)
            .filter(|&at| {
                probed.iter().all(|p| {
                    // SAFETY: `p.object` is a live `TensorBase` instance
                    // (checked above, held by `tensors`), at least `size`
                    // bytes long; `at + 8 <= size`; object memory is word
                    // aligned.
                    let w = unsafe { std::ptr::read(p.object.add(at).cast::<usize>()) };
                    w == p.cdata
                })
            })
            .collect();
        let [impl_at] = at.as_slice() else {
            return None;
        };
        let single = |w: u64| w.count_ones() == 1;
        let learnt: Vec<KeySet> = (1..IMPL_WORDS)
            .filter_map(|k| {
                let w = |p: &Probed| p.words[k];
                let (n, c, z) = (w(neg) ^ w(plain), w(conj) ^ w(plain), w(zero) ^ w(plain));
                let tracked = w(plain) ^ w(inference);
                let keys = KeySet {
                    impl_at: *impl_at,
                    keys_at: k * 8,
                    neg: n,
                    conj: c,
                    zero: z,
                    tracked,
                };
                let ok = single(n)
                    && single(c)
                    && single(z)
                    && (n | c | z).count_ones() == 3
                    && tracked != 0
                    && tracked & (n | c | z) == 0
                    && w(plain) & tracked == tracked
                    && probed.iter().all(|p| {
                        let bits = keys.bits(w(p));
                        (
                            bits.negative,
                            bits.conjugate,
                            bits.zero,
                            keys.inference(w(p)),
                        ) == (p.neg, p.conj, p.zero, p.inference)
                    });
                ok.then_some(keys)
            })
            .collect();
        match learnt.as_slice() {
            [keys] => Some(*keys),
            _ => None,
        }
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
