//! Element types: DLPack's `DLDataType` as plain integers, and the Rust types
//! a view can hold.

use std::fmt;

/// A DLPack data type: `(code, bits, lanes)` exactly as in `DLDataType` of
/// the DLPack header. Codes are kept as integers, so codes this crate does
/// not know survive to error messages unchanged.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct DType {
    /// `DLDataTypeCode`: 0 int, 1 uint, 2 float, 4 bfloat, 5 complex, 6 bool, ...
    pub code: u8,
    /// Bits of one lane (8, 16, 32, 64, 128; 4 and 6 for packed sub-byte types).
    pub bits: u8,
    /// Vector lanes; every array element type dlcast accepts has `lanes == 1`.
    pub lanes: u16,
}

pub use crate::facts::code;
use crate::facts::{DTypeFacts, DTYPES};

/// For each DLPack code up to [`code::FLOAT8_E8M0FNU`] and each size of 8
/// to 128 bits (by `log2(bits) - 3`), the index of its row in [`DTYPES`]
/// plus one (0: none); built from the table at compile time.
const ROWS: [[u8; 5]; 15] = {
    let mut rows = [[0u8; 5]; 15];
    let mut i = 0;
    while i < DTYPES.len() {
        let d = &DTYPES[i];
        assert!(d.bits.is_power_of_two() && d.bits >= 8 && d.bits <= 128);
        assert!((d.code as usize) < rows.len());
        rows[d.code as usize][(d.bits.trailing_zeros() - 3) as usize] = i as u8 + 1;
        i += 1;
    }
    rows
};

impl DType {
    /// Builds a data type from its raw DLPack fields.
    pub const fn new(code: u8, bits: u8, lanes: u16) -> Self {
        DType { code, bits, lanes }
    }
}

/// The `DType` constant of each row of the dtype table (`DType::FLOAT32`).
macro_rules! dtype_consts {
    ($({$name:literal $rust:ident $const:ident [$ty:ty] $(as $alias:ident)? $(if $($feature:literal)+)?
       $(aka $($aka:ident)+)? $(($by:ident by hand))?;
       $code:ident $bits:literal $($rest:tt)*})*) => {
        impl DType {$(
            #[doc = concat!("`", $name, "`: DLPack code `", stringify!($code), "`, ", $bits, " bits.")]
            pub const $const: DType = DType::new(code::$code, $bits, 1);
        )*}
    };
}
crate::facts::dtype_table!(dtype_consts);

impl DType {
    /// This dtype's row of the dtype table ([`crate::facts::DTYPES`]):
    /// `None` for every `(code, bits, lanes)` dlcast does not map to a
    /// Rust element type.
    #[inline]
    pub(crate) fn facts(&self) -> Option<&'static DTypeFacts> {
        DTYPES.get(self.row()?)
    }

    /// The index of this dtype's row in [`crate::facts::DTYPES`] (see
    /// [`DType::facts`]).
    #[inline]
    pub(crate) fn row(&self) -> Option<usize> {
        if self.lanes != 1 || !self.bits.is_power_of_two() || self.bits < 8 || self.bits > 128 {
            return None;
        }
        let row = *ROWS
            .get(usize::from(self.code))?
            .get(self.bits.trailing_zeros() as usize - 3)?;
        usize::from(row).checked_sub(1)
    }

    /// The NumPy-style name (`"float32"`) of the data types dlcast maps to a
    /// Rust element type; `None` for every other `(code, bits, lanes)`.
    #[inline]
    pub fn name(&self) -> Option<&'static str> {
        self.facts().map(|f| f.name)
    }

    /// Size of one element in bytes, for the data types that [`DType::name`]
    /// knows; `None` for sub-byte, vector (`lanes != 1`) and unknown types.
    #[inline]
    pub fn itemsize(&self) -> Option<usize> {
        self.facts().map(|_| usize::from(self.bits) / 8)
    }

    /// The alignment in bytes of the Rust element type of this dtype (a
    /// complex number is aligned as its parts); `None` where
    /// [`DType::itemsize`] is.
    #[inline]
    pub fn align(&self) -> Option<usize> {
        let size = self.itemsize()?;
        Some(
            if self.code == code::COMPLEX {
                size / 2
            } else {
                size
            }
            .max(1),
        )
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(
                f,
                "dtype(code={}, bits={}, lanes={})",
                self.code, self.bits, self.lanes
            ),
        }
    }
}

/// A Rust type that can be the element of a view.
///
/// # Safety
/// `DTYPE` must describe exactly the in-memory representation of `Self`
/// (same size, same bit layout), and every bit pattern of that size must be
/// a valid `Self` unless [`Element::ALL_BIT_PATTERNS_VALID`] is `false`.
/// Only dlcast implements this trait.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an array element type dlcast supports",
    note = "elements: bool, i8..i64, u8..u64, f32, f64, half::f16, half::bf16, microfloat::f8e4m3fn, f8e5m2 (and the other float8 types), num_complex::Complex<f32>/<f64>; for a dtype read at run time use TensorDyn"
)]
pub unsafe trait Element: Copy + Send + Sync + 'static {
    /// The DLPack data type of this element.
    const DTYPE: DType;
    /// `false` for types where some byte patterns are not valid values
    /// (`bool`: only 0 and 1). For those, dlcast reads bytes and converts,
    /// and hands out slices only after checking every element.
    const ALL_BIT_PATTERNS_VALID: bool = true;

    /// Reads one element from possibly unaligned memory.
    ///
    /// # Safety
    /// `ptr` must be valid for reads of `size_of::<Self>()` bytes.
    #[doc(hidden)]
    unsafe fn read_at(ptr: *const Self) -> Self {
        // SAFETY: the caller guarantees `ptr` is readable for one element;
        // `read_unaligned` needs no alignment, and every bit pattern is a
        // valid `Self` (trait contract) for the types using this default.
        unsafe { ptr.read_unaligned() }
    }

    /// Whether the bytes at `ptr` hold a valid value of `Self`.
    ///
    /// # Safety
    /// `ptr` must be valid for reads of `size_of::<Self>()` bytes.
    #[doc(hidden)]
    unsafe fn is_valid_at(_ptr: *const Self) -> bool {
        true
    }
}

/// A type each of whose bit patterns (of its size) is a value, with no
/// padding: what a generated `Element` impl (below) asks of its row's type
/// at compile time, so that a row cannot declare, say, `char` or `bool`
/// an element type whose every byte is a value.
///
/// # Safety
/// Every bit pattern of `size_of::<Self>()` bytes is a valid `Self`.
unsafe trait AllBitPatterns {}

macro_rules! all_bit_patterns {
    ($($(#[$cfg:meta])? $t:ty),* $(,)?) => {$(
        $(#[$cfg])?
        // SAFETY: a plain integer or IEEE float, or a `half`/`microfloat`
        // `#[repr(transparent)]` newtype of `u16`/`u8` whose constructors
        // (`from_bits`) take any bits of that size.
        unsafe impl AllBitPatterns for $t {}
    )*};
}
all_bit_patterns!(
    i8,
    i16,
    i32,
    i64,
    u8,
    u16,
    u32,
    u64,
    f32,
    f64,
    #[cfg(feature = "half")]
    half::f16,
    #[cfg(feature = "half")]
    half::bf16,
    #[cfg(feature = "float8")]
    microfloat::f8e3m4,
    #[cfg(feature = "float8")]
    microfloat::f8e4m3,
    #[cfg(feature = "float8")]
    microfloat::f8e4m3b11fnuz,
    #[cfg(feature = "float8")]
    microfloat::f8e4m3fn,
    #[cfg(feature = "float8")]
    microfloat::f8e4m3fnuz,
    #[cfg(feature = "float8")]
    microfloat::f8e5m2,
    #[cfg(feature = "float8")]
    microfloat::f8e5m2fnuz,
    #[cfg(feature = "float8")]
    microfloat::f8e8m0fnu,
);

// SAFETY: `num_complex::Complex` is `#[repr(C)]` `{ re: T, im: T }`: two
// fields of one type, so no padding, and any bits of each are a `T`.
#[cfg(feature = "complex")]
unsafe impl<T: AllBitPatterns> AllBitPatterns for num_complex::Complex<T> {}

/// The `Element` impl of each row of the dtype table, but those marked
/// `element by hand`.
macro_rules! element_impls {
    ($({$name:literal $rust:ident $const:ident [$ty:ty] $(as $alias:ident)? $(if $($feature:literal)+)?
       $(aka $($aka:ident)+)? $(($by:ident by hand))?;
       $code:ident $bits:literal $($rest:tt)*})*) => {$(
        element_impls!(@row [$ty] $const $bits $($($feature)+)? ; $($by)?);
    )*};
    (@row [$ty:ty] $const:ident $bits:literal $($feature:literal)* ; $by:ident) => {};
    (@row [$ty:ty] $const:ident $bits:literal $($feature:literal)* ;) => {
        // The row's size and alignment are the type's (a complex number's
        // alignment is its parts'), and every bit pattern is a value of it.
        #[cfg(all($(feature = $feature),*))]
        const _: () = {
            const fn all_bit_patterns<T: AllBitPatterns>() {}
            all_bit_patterns::<$ty>();
            let size = $bits / 8;
            assert!(core::mem::size_of::<$ty>() == size);
            let complex = DType::$const.code == code::COMPLEX;
            assert!(core::mem::align_of::<$ty>() == if complex { size / 2 } else { size });
        };
        #[cfg(all($(feature = $feature),*))]
        // SAFETY: the row's dtype has the size and alignment of the row's
        // type, and every bit pattern of that size is a value of it: both
        // checked at compile time just above (`AllBitPatterns`).
        unsafe impl Element for $ty {
            const DTYPE: DType = DType::$const;
        }
    };
}
crate::facts::dtype_table!(element_impls);

// SAFETY: DLPack's bool is one byte (code 6, 8 bits), like Rust's `bool`.
// Not every byte is a valid `bool`, so reads go through `u8` and slices are
// only formed after `is_valid_at` accepted every element.
unsafe impl Element for bool {
    const DTYPE: DType = DType::BOOL;
    const ALL_BIT_PATTERNS_VALID: bool = false;

    unsafe fn read_at(ptr: *const Self) -> Self {
        // SAFETY: the caller guarantees one readable byte at `ptr`; reading
        // it as `u8` is valid for any value.
        unsafe { ptr.cast::<u8>().read() != 0 }
    }

    unsafe fn is_valid_at(ptr: *const Self) -> bool {
        // SAFETY: as in `read_at`.
        unsafe { ptr.cast::<u8>().read() <= 1 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_sizes() {
        assert_eq!(DType::FLOAT32.to_string(), "float32");
        assert_eq!(DType::COMPLEX128.itemsize(), Some(16));
        assert_eq!(DType::new(2, 32, 4).name(), None);
        assert_eq!(
            DType::new(9, 16, 1).to_string(),
            "dtype(code=9, bits=16, lanes=1)"
        );
        assert_eq!(DType::new(10, 8, 1).to_string(), "float8_e4m3fn");
        assert_eq!(DType::new(12, 8, 1).to_string(), "float8_e5m2");
        assert_eq!(DType::FLOAT8_E8M0FNU.itemsize(), Some(1));
        assert_eq!(DType::new(2, 32, 4).itemsize(), None);
    }

    #[test]
    fn each_row_is_its_element_type() {
        fn check<T: Element>(rust: &str) -> usize {
            let row = DTYPES.iter().find(|d| d.rust == rust).expect("a row");
            let dtype = DType::new(row.code, row.bits, 1);
            assert_eq!(T::DTYPE, dtype, "{rust}");
            assert_eq!(dtype.name(), Some(row.name));
            assert_eq!(dtype.facts().map(|f| f.rust), Some(row.rust));
            assert_eq!(dtype.itemsize(), Some(std::mem::size_of::<T>()), "{rust}");
            assert_eq!(dtype.align(), Some(std::mem::align_of::<T>()), "{rust}");
            1
        }
        macro_rules! check_rows {
            ($({$name:literal $rust:ident $const:ident [$ty:ty] $(as $alias:ident)?
               $(if $($feature:literal)+)? $(aka $($aka:ident)+)? $(($by:ident by hand))?;
               $($rest:tt)*})*) => {{
                let mut n = 0;
                $(
                    #[cfg(all($($(feature = $feature),+)?))]
                    {
                        n += check::<$ty>(stringify!($rust));
                    }
                )*
                n
            }};
        }
        let n = crate::facts::dtype_table!(check_rows);
        if cfg!(all(
            feature = "half",
            feature = "complex",
            feature = "float8"
        )) {
            assert_eq!(n, DTYPES.len(), "a row without an Element type");
        }
    }

    #[test]
    fn aliases_are_the_dtype_names() {
        // The `__private` alias of a row is its `#[dtype]` name in capitals
        // (`C64` for `c64`), never a name its crate gives another type
        // (`num_complex::Complex64` is `Complex<f64>`, dlcast's `c128`).
        for d in DTYPES {
            if let Some(alias) = d.element.strip_prefix("::dlcast_runtime::__private::") {
                assert_eq!(alias.to_ascii_lowercase(), d.rust, "{}", d.name);
            } else {
                assert_eq!(d.element, d.rust, "{}", d.name);
            }
        }
    }

    #[test]
    fn typestrs_are_kind_and_size() {
        for d in DTYPES {
            let Some(typestr) = d.typestr else {
                assert!(d.numpy.is_empty(), "{}", d.name);
                continue;
            };
            let kind = match d.kind {
                crate::facts::Kind::Bool => 'b',
                crate::facts::Kind::UInt => 'u',
                crate::facts::Kind::Int => 'i',
                crate::facts::Kind::Float => 'f',
                crate::facts::Kind::Complex => 'c',
            };
            assert_eq!(typestr, format!("{kind}{}", d.bits / 8), "{}", d.name);
        }
        // Unknown codes, sizes and lanes have no row.
        for (c, b, l) in [
            (2, 32, 2),
            (2, 24, 1),
            (2, 0, 1),
            (2, 255, 1),
            (7, 16, 1),
            (10, 8, 2),
            (15, 8, 1),
            (17, 4, 1),
            (3, 64, 1),
        ] {
            assert!(DType::new(c, b, l).facts().is_none(), "{c} {b} {l}");
        }
    }

    #[test]
    fn dtypes_numpy_lacks_are_absent_from_numpy() {
        use crate::facts::Framework;
        for d in DTYPES {
            assert_eq!(
                d.numpy.is_empty(),
                d.absent_from.contains(&Framework::Numpy),
                "{}",
                d.name
            );
        }
        let torch_lacks: Vec<&str> = DTYPES
            .iter()
            .filter(|d| d.absent_from.contains(&Framework::Torch))
            .map(|d| d.name)
            .collect();
        assert_eq!(
            torch_lacks,
            ["float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz"]
        );
    }

    #[test]
    fn bool_reads_bytes() {
        let bytes = [0u8, 1, 2];
        let p = bytes.as_ptr().cast::<bool>();
        // SAFETY: `p` points into `bytes`, three readable bytes.
        unsafe {
            assert!(!bool::read_at(p));
            assert!(bool::read_at(p.add(1)));
            assert!(bool::is_valid_at(p.add(1)));
            assert!(!bool::is_valid_at(p.add(2)));
        }
    }
}
