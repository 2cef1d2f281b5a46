//! The facts dlcast keeps about array frameworks and element types: one
//! table each, one row per framework or dtype.
//!
//! This file is shared, unchanged, by both crates: it is
//! `dlcast-runtime/src/facts.rs`, and `dlcast-macros/src/facts.rs` is a
//! symlink to it (packaged as a copy, like each crate's README). It
//! therefore depends on nothing but `core`: plain `const` tables and the
//! enums their columns use. Who reads what:
//! - the runtime: [`Framework`] itself, `Framework::of` (the `modules`
//!   column), the hand-off of `returns = <option>` (`export/handoff.rs`:
//!   the `name`, `handover`, `host_only`, `read_only` and `layout`
//!   columns, read generically: what is refused, what is copied, what is
//!   handed to which function), the import of a producer's capsules
//!   (`import/exchange.rs`'s `arrays_immutable`, `import/mod.rs` and
//!   `import/torch/mod.rs`: the `modules`, `read_only` and
//!   `legacy_writable` columns: which producers' arrays are immutable,
//!   whose legacy capsules may be written, and which objects are
//!   TensorFlow's), conversions (`convert.rs`: the `convert` column), the
//!   names, sizes, NumPy type numbers, buffer formats,
//!   casting kinds and absences (`export/handoff.rs`) of dtypes (`dtype.rs`, `convert.rs`, `npapi.rs`,
//!   `import/numpy.rs`, `import/buffer_protocol.rs`);
//! - the Rust side of each dtype, generated from its row of
//!   `dtype_table!` (the rows [`DTYPES`] is built from): its `DType`
//!   constant and `Element` impl (`dtype.rs`), and the `__private` alias
//!   the macro's generated code names (`lib.rs`);
//! - the macro: `returns = <option>` and the Python type name of the
//!   signature line ([`FRAMEWORKS`]), `#[dtype(..)]`'s names, element types
//!   and NumPy names, and the signature line's name of an element type
//!   however it is spelt (`ty` and `aka`) ([`DTYPES`]);
//! - every other copy of these facts (the stub generator's block, the
//!   Python tests' `tests/python/facts_table.py`, the option lists of the
//!   ui snapshots, the docs' lists and the guide's `returns` table):
//!   `ui-tests/tests/facts.rs` generates each, and fails, naming the file,
//!   while one lags the tables.
//!
//! Adding a framework: one row of [`FRAMEWORKS`] (which also declares its
//! [`Framework`] variant; a way of handing arrays over that no row uses yet
//! is a new [`Handover`] variant, whose arm the compiler then asks for in
//! the hand-off and the guide's table), its package in
//! `scripts/requirements-test.txt` (the Python tests hand arrays to, and
//! convert arrays of, every row of the table, and in CI none of them may
//! skip), and `DLCAST_BLESS=1 cargo test -p dlcast-ui-tests --test facts`,
//! which rewrites every generated copy (ui snapshots and docs included).
//! What the table cannot know (a framework whose arrays need a device, or
//! that numpy cannot read back) goes into the Python tests' quirk lists
//! (`tests/python/test_exports.py`, `test_conversions.py`). Adding a dtype:
//! one row of `dtype_table!` (its `Element` impl, constant and alias
//! follow from it; a type whose bytes are not all values is marked
//! `element by hand` and gets its impl in `dtype.rs`), and the same
//! command; the Python tests round-trip every row, and what a framework
//! does not take is the row's `absent from`. PyTorch's own code for it,
//! if PyTorch has the dtype, goes into `SCALAR_TYPES`
//! (`import/torch/direct/mod.rs`), which a test checks against the table.

use core::ffi::CStr;

/// `DLDataTypeCode` values from the DLPack header (v1.3).
pub mod code {
    /// Signed integer.
    pub const INT: u8 = 0;
    /// Unsigned integer.
    pub const UINT: u8 = 1;
    /// IEEE floating point.
    pub const FLOAT: u8 = 2;
    /// Opaque handle (testing only).
    pub const OPAQUE_HANDLE: u8 = 3;
    /// bfloat16.
    pub const BFLOAT: u8 = 4;
    /// Complex: two floats of `bits / 2` each.
    pub const COMPLEX: u8 = 5;
    /// Boolean, stored as one byte per element.
    pub const BOOL: u8 = 6;
    /// float8 E3M4 (bias 3, IEEE-like infinities and NaNs).
    pub const FLOAT8_E3M4: u8 = 7;
    /// float8 E4M3 (bias 7, IEEE-like infinities and NaNs).
    pub const FLOAT8_E4M3: u8 = 8;
    /// float8 E4M3 with bias 11, finite, one NaN, no negative zero.
    pub const FLOAT8_E4M3B11FNUZ: u8 = 9;
    /// float8 E4M3, finite (OCP's E4M3: no infinities, NaN `S.1111.111`).
    pub const FLOAT8_E4M3FN: u8 = 10;
    /// float8 E4M3 with bias 8, finite, one NaN, no negative zero.
    pub const FLOAT8_E4M3FNUZ: u8 = 11;
    /// float8 E5M2 (OCP's E5M2: IEEE-like infinities and NaNs).
    pub const FLOAT8_E5M2: u8 = 12;
    /// float8 E5M2 with bias 16, finite, one NaN, no negative zero.
    pub const FLOAT8_E5M2FNUZ: u8 = 13;
    /// float8 E8M0 (an exponent only: a power of two, no sign, no zero).
    pub const FLOAT8_E8M0FNU: u8 = 14;
    // 15 to 17 (float6 and float4) are sub-byte types, packed in memory:
    // no array element type dlcast maps them to.
}

/// NumPy's type numbers (`enum NPY_TYPES` of `ndarraytypes.h`, the same in
/// NumPy 1.x and 2.x), part of NumPy's ABI: declared here because the
/// dtype table uses them, and re-exported by the runtime's NumPy ABI
/// module with the rest of that ABI.
pub mod npy_type {
    /// `NPY_BOOL`.
    pub const BOOL: i32 = 0;
    /// `NPY_BYTE` (`signed char`).
    pub const BYTE: i32 = 1;
    /// `NPY_UBYTE`.
    pub const UBYTE: i32 = 2;
    /// `NPY_SHORT`.
    pub const SHORT: i32 = 3;
    /// `NPY_USHORT`.
    pub const USHORT: i32 = 4;
    /// `NPY_INT` (`int`, 32 bits on every platform dlcast supports).
    pub const INT: i32 = 5;
    /// `NPY_UINT`.
    pub const UINT: i32 = 6;
    /// `NPY_LONG` (C `long`: 64 bits on Unix, 32 on Windows).
    pub const LONG: i32 = 7;
    /// `NPY_ULONG`.
    pub const ULONG: i32 = 8;
    /// `NPY_LONGLONG` (64 bits).
    pub const LONGLONG: i32 = 9;
    /// `NPY_ULONGLONG`.
    pub const ULONGLONG: i32 = 10;
    /// `NPY_FLOAT`.
    pub const FLOAT: i32 = 11;
    /// `NPY_DOUBLE`.
    pub const DOUBLE: i32 = 12;
    /// `NPY_CFLOAT`.
    pub const CFLOAT: i32 = 14;
    /// `NPY_CDOUBLE`.
    pub const CDOUBLE: i32 = 15;
    /// `NPY_HALF`.
    pub const HALF: i32 = 23;
}

/// Whether C's `long` has 64 bits (NumPy's `NPY_LONG` then is `int64`).
const LONG_IS_64: bool = core::mem::size_of::<core::ffi::c_long>() == 8;

/// A dtype's kind: its place on NumPy's casting ladder, lowest first. A
/// same-kind cast (what dlcast converts implicitly) never goes down it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// `bool`.
    Bool,
    /// Unsigned integers.
    UInt,
    /// Signed integers.
    Int,
    /// Floats, bfloat16 and the float8 types included.
    Float,
    /// Complex numbers.
    Complex,
}

/// One element type dlcast maps to a Rust type.
#[derive(Clone, Copy, Debug)]
pub struct DTypeFacts {
    /// The NumPy / array API name (`"float32"`), shown to Python.
    pub name: &'static str,
    /// The name `#[dtype(..)]` takes (`f32`).
    pub rust: &'static str,
    /// The element type's path in generated code (its `__private` alias,
    /// or the primitive type itself).
    pub element: &'static str,
    /// The element type as the table writes it (`"num_complex :: Complex
    /// < f32 >"`, tokens spaced as `stringify!` spaces them).
    pub ty: &'static str,
    /// Other names its crate gives the type (`num_complex`'s `Complex32`).
    pub aka: &'static [&'static str],
    /// DLPack's `DLDataType.code` ([`code`]).
    pub code: u8,
    /// DLPack's `DLDataType.bits` (`lanes` is 1 for every row).
    pub bits: u8,
    /// The kind, for same-kind casts.
    pub kind: Kind,
    /// NumPy's type numbers ([`npy_type`]) whose arrays are this dtype on
    /// this platform; the first is the one dlcast creates. Empty where
    /// NumPy has no such type (bfloat16, the float8 types).
    pub numpy: &'static [i32],
    /// The buffer protocol's format (PEP 3118 / `struct`) dlcast exports;
    /// `None` where `struct` has none.
    pub format: Option<&'static CStr>,
    /// NumPy's array-interface `typestr` without its byte-order character
    /// (`"f4"`); `None` where NumPy has none.
    pub typestr: Option<&'static str>,
    /// The frameworks that have no such dtype: `returns = <it>` refuses an
    /// array of it, saying so, before anything is handed over (rather than
    /// pass on the framework's own error).
    pub absent_from: &'static [Framework],
}

/// The dtype table itself, as tokens: `dtype_table!(then)` hands every row
/// to the macro `then`, so that each crate builds what it needs from the
/// same rows ([`DTYPES`] here; in the runtime the `DType` constants, the
/// `Element` impls and the `__private` aliases the macro's generated code
/// names). A row:
///
/// `{"<name>" <#[dtype] name> <DType constant> [<Rust element type>]
///  (as <alias in __private>) (if "<cargo feature>"...) (aka <other names of
///  the type>) (element by hand);
///  <DLPack code> <bits> <kind> [<NumPy type numbers>] <format>, <typestr>
///  (, absent from <frameworks>);}`
///
/// `aka` lists the names the type's crate gives it too (`num_complex`'s
/// `Complex32` is `Complex<f32>`), which the signature line recognises;
/// `element by hand` marks the one type whose `Element` impl is written out
/// (`bool`: not every byte is a value).
macro_rules! dtype_table {
    ($then:ident) => { $then! {
        { "bool"       bool BOOL       [bool] (element by hand);
            BOOL 8 Bool [&[npy_type::BOOL]] Some(c"?"), Some("b1"); }
        { "int8"       i8   INT8       [i8];
            INT 8 Int [&[npy_type::BYTE]] Some(c"b"), Some("i1"); }
        { "int16"      i16  INT16      [i16];
            INT 16 Int [&[npy_type::SHORT]] Some(c"h"), Some("i2"); }
        { "int32"      i32  INT32      [i32];
            INT 32 Int
            [if LONG_IS_64 { &[npy_type::INT] } else { &[npy_type::INT, npy_type::LONG] }]
            Some(c"i"), Some("i4"); }
        { "int64"      i64  INT64      [i64];
            INT 64 Int
            [if LONG_IS_64 { &[npy_type::LONG, npy_type::LONGLONG] } else { &[npy_type::LONGLONG] }]
            Some(c"q"), Some("i8"); }
        { "uint8"      u8   UINT8      [u8];
            UINT 8 UInt [&[npy_type::UBYTE]] Some(c"B"), Some("u1"); }
        { "uint16"     u16  UINT16     [u16];
            UINT 16 UInt [&[npy_type::USHORT]] Some(c"H"), Some("u2"); }
        { "uint32"     u32  UINT32     [u32];
            UINT 32 UInt
            [if LONG_IS_64 { &[npy_type::UINT] } else { &[npy_type::UINT, npy_type::ULONG] }]
            Some(c"I"), Some("u4"); }
        { "uint64"     u64  UINT64     [u64];
            UINT 64 UInt
            [if LONG_IS_64 { &[npy_type::ULONG, npy_type::ULONGLONG] } else { &[npy_type::ULONGLONG] }]
            Some(c"Q"), Some("u8"); }
        { "float16"    f16  FLOAT16    [half::f16] as F16 if "half";
            FLOAT 16 Float [&[npy_type::HALF]] Some(c"e"), Some("f2"), absent from ArrayApi; }
        { "bfloat16"   bf16 BFLOAT16   [half::bf16] as BF16 if "half";
            BFLOAT 16 Float [&[]] None, None, absent from Numpy ArrayApi; }
        { "float32"    f32  FLOAT32    [f32];
            FLOAT 32 Float [&[npy_type::FLOAT]] Some(c"f"), Some("f4"); }
        { "float64"    f64  FLOAT64    [f64];
            FLOAT 64 Float [&[npy_type::DOUBLE]] Some(c"d"), Some("f8"); }
        { "complex64"  c64  COMPLEX64  [num_complex::Complex<f32>] as C64 if "complex"
            aka Complex32;
            COMPLEX 64 Complex [&[npy_type::CFLOAT]] Some(c"Zf"), Some("c8"); }
        { "complex128" c128 COMPLEX128 [num_complex::Complex<f64>] as C128 if "complex"
            aka Complex64;
            COMPLEX 128 Complex [&[npy_type::CDOUBLE]] Some(c"Zd"), Some("c16"); }
        // The float8 types (feature `float8`): NumPy has none (ml_dtypes
        // adds them as user dtypes, which DLPack cannot export), nor has
        // `struct`; PyTorch has five of them (not E3M4, E4M3, E4M3B11FNUZ),
        // JAX (through ml_dtypes) all.
        { "float8_e3m4" f8e3m4 FLOAT8_E3M4 [microfloat::f8e3m4] as F8E3M4 if "float8";
            FLOAT8_E3M4 8 Float [&[]] None, None, absent from Numpy ArrayApi Torch; }
        { "float8_e4m3" f8e4m3 FLOAT8_E4M3 [microfloat::f8e4m3] as F8E4M3 if "float8";
            FLOAT8_E4M3 8 Float [&[]] None, None, absent from Numpy ArrayApi Torch; }
        { "float8_e4m3b11fnuz" f8e4m3b11fnuz FLOAT8_E4M3B11FNUZ [microfloat::f8e4m3b11fnuz]
            as F8E4M3B11Fnuz if "float8";
            FLOAT8_E4M3B11FNUZ 8 Float [&[]] None, None, absent from Numpy ArrayApi Torch; }
        { "float8_e4m3fn" f8e4m3fn FLOAT8_E4M3FN [microfloat::f8e4m3fn] as F8E4M3Fn if "float8";
            FLOAT8_E4M3FN 8 Float [&[]] None, None, absent from Numpy ArrayApi; }
        { "float8_e4m3fnuz" f8e4m3fnuz FLOAT8_E4M3FNUZ [microfloat::f8e4m3fnuz]
            as F8E4M3Fnuz if "float8";
            FLOAT8_E4M3FNUZ 8 Float [&[]] None, None, absent from Numpy ArrayApi; }
        { "float8_e5m2" f8e5m2 FLOAT8_E5M2 [microfloat::f8e5m2] as F8E5M2 if "float8";
            FLOAT8_E5M2 8 Float [&[]] None, None, absent from Numpy ArrayApi; }
        { "float8_e5m2fnuz" f8e5m2fnuz FLOAT8_E5M2FNUZ [microfloat::f8e5m2fnuz]
            as F8E5M2Fnuz if "float8";
            FLOAT8_E5M2FNUZ 8 Float [&[]] None, None, absent from Numpy ArrayApi; }
        { "float8_e8m0fnu" f8e8m0fnu FLOAT8_E8M0FNU [microfloat::f8e8m0fnu] as F8E8M0Fnu if "float8";
            FLOAT8_E8M0FNU 8 Float [&[]] None, None, absent from Numpy ArrayApi; }
    } };
}
#[allow(unused_imports)] // the macros crate builds only `DTYPES` from it
pub(crate) use dtype_table;

/// Builds [`DTYPES`] from the rows of `dtype_table!`.
macro_rules! dtypes {
    ($({$name:literal $rust:ident $const:ident [$ty:ty] $(as $alias:ident)? $(if $($feature:literal)+)?
       $(aka $($aka:ident)+)? $(($by:ident by hand))?;
       $code:ident $bits:literal $kind:ident [$numpy:expr] $format:expr, $typestr:expr
       $(, absent from $($absent:ident)+)?;})*) => {
        /// The element types dlcast supports, one row each.
        pub const DTYPES: &[DTypeFacts] = &[$(DTypeFacts {
            name: $name,
            rust: stringify!($rust),
            element: dtypes!(@element $ty $(, $alias)?),
            ty: stringify!($ty),
            aka: &[$($(stringify!($aka)),+)?],
            code: code::$code,
            bits: $bits,
            kind: Kind::$kind,
            numpy: $numpy,
            format: $format,
            typestr: $typestr,
            absent_from: &[$($(Framework::$absent),+)?],
        }),*];
    };
    (@element $ty:ty) => { stringify!($ty) };
    (@element $ty:ty, $alias:ident) => { concat!("::dlcast_runtime::__private::", stringify!($alias)) };
}

dtype_table!(dtypes);

/// How an array is handed to a framework (`returns = ...`), and the
/// function that takes it (`module.func`, looked up once).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handover {
    /// The `dlcast.Array` itself, to `module.func` (a `from_dlpack`), which
    /// calls its `__dlpack__`; a copy made for the hand-over (read-only
    /// data of a framework whose arrays are immutable, [`ReadOnly::Immutable`],
    /// among others) through a consumer that gives it once.
    FromDlpack {
        module: &'static str,
        func: &'static str,
    },
    /// A legacy DLPack capsule, to `module.func` (which takes no object
    /// with `__dlpack__`).
    LegacyCapsule {
        module: &'static str,
        func: &'static str,
    },
    /// An `ndarray` made through NumPy's verified C API, whose `base` is
    /// the `dlcast.Array`; as [`Handover::FromDlpack`] where that API
    /// cannot be used.
    NumpyCApi {
        module: &'static str,
        func: &'static str,
    },
    /// PyTorch's verified DLPack exchange table, for host memory; as
    /// [`Handover::FromDlpack`] for device memory or where the table is
    /// missing.
    TorchExchange {
        module: &'static str,
        func: &'static str,
    },
    /// The `dlcast.Array`'s buffer protocol, to `module.func` (a
    /// `memoryview`); below abi3-py311, where the class has none, NumPy's
    /// array over the same memory.
    Buffer {
        module: &'static str,
        func: &'static str,
    },
}

impl Handover {
    /// The module and attribute of the function that takes the array.
    pub const fn importer(self) -> (&'static str, &'static str) {
        match self {
            Handover::FromDlpack { module, func }
            | Handover::LegacyCapsule { module, func }
            | Handover::NumpyCApi { module, func }
            | Handover::TorchExchange { module, func }
            | Handover::Buffer { module, func } => (module, func),
        }
    }
}

/// What becomes of read-only data handed to a framework.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadOnly {
    /// It goes marked read-only (DLPack's `READ_ONLY` flag, NumPy's
    /// `writeable=False`, a read-only buffer).
    Marked,
    /// The framework's arrays are immutable, and its importer takes only a
    /// legacy capsule, which cannot say read-only: host memory goes as a
    /// copy (made as a read in the borrow registry), given to the importer
    /// alone; device memory is refused.
    Immutable,
    /// The framework has no read-only arrays (it ignores DLPack's
    /// `READ_ONLY`): host memory goes as a writable copy (made as a read in
    /// the borrow registry), the framework's alone; device memory is
    /// refused before anything is handed over.
    Refused,
}

impl ReadOnly {
    /// Whether the framework's arrays are all writable (it has no
    /// read-only arrays: [`ReadOnly::Refused`]). Matched in full, so that
    /// a new variant is decided here.
    pub const fn arrays_always_writable(self) -> bool {
        match self {
            ReadOnly::Refused => true,
            ReadOnly::Marked | ReadOnly::Immutable => false,
        }
    }

    /// Whether the framework's arrays never change
    /// ([`ReadOnly::Immutable`]). Matched in full.
    pub const fn arrays_immutable(self) -> bool {
        match self {
            ReadOnly::Immutable => true,
            ReadOnly::Marked | ReadOnly::Refused => false,
        }
    }
}

/// What becomes of a layout a framework cannot take as it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Every layout goes as it is.
    AsIs,
    /// Host memory that is not compact (C or F order) and aligned, or that
    /// an object may still write, goes as an aligned C-order copy.
    CompactCopy,
    /// Negative strides go as a C-order copy.
    NegativeStridesCopied,
    /// Negative strides (of a dimension with more than one index) are
    /// refused before anything is handed over.
    NegativeStridesRefused,
}

/// How an argument's own framework converts it (an implicit conversion of
/// device memory, or to a dtype NumPy lacks: host memory that NumPy can
/// view is converted by NumPy, whoever produced it; see `convert.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Convert {
    /// `x.astype(dtype, order=...)`, NumPy's method (CuPy has the same); a
    /// dtype NumPy lacks is refused.
    NumpyAstype,
    /// `TensorBase`'s own `detach`, `to`, `contiguous` and `permute`, run
    /// on dlcast's private alias.
    TorchTo,
    /// `x.astype(dtype)`, in C order only (the arrays are row-major); a
    /// 64-bit target of host memory is NumPy's to convert (JAX without
    /// `jax_enable_x64` silently keeps 32 bits).
    JaxAstype,
    /// `x.__array_namespace__().astype(x, dtype)`, in C order only.
    NamespaceAstype,
    /// `tensorflow.cast(x, dtype)`, in C order only.
    TensorflowCast,
    /// Only what NumPy can view converts (by NumPy).
    NumpyOnly,
}

/// How the stub generator writes a framework's array type.
#[derive(Clone, Copy, Debug)]
pub struct Stub {
    /// The type in the stub (`"torch.Tensor"`).
    pub ty: &'static str,
    /// The modules the stub imports for it (none for a builtin).
    pub imports: &'static [&'static str],
    /// Whether the package ships type information (`py.typed`); the stub
    /// imports the others with a `type: ignore` (their arrays then type as
    /// `Any` under a type checker).
    pub typed: bool,
}

/// One framework dlcast hands arrays to and recognises arrays of.
#[derive(Clone, Copy, Debug)]
pub struct FrameworkFacts {
    /// The framework (`FRAMEWORKS[f as usize].id == f`).
    pub id: Framework,
    /// Its name in `#[dlpack_fn(returns = <option>)]`.
    pub option: &'static str,
    /// `"returns = <option>"`, as messages name a copy for it.
    pub returns: &'static str,
    /// The top-level packages of its array types (`returns = like(x)`,
    /// conversions): `type(x).__module__` up to the first dot.
    pub modules: &'static [&'static str],
    /// The Python type of its arrays as the signature line names it.
    pub python_type: &'static str,
    /// Its name in messages (`"PyTorch"`).
    pub name: &'static str,
    /// How an array is handed over, and to which function.
    pub handover: Handover,
    /// Whether it takes host memory only: device memory is refused before
    /// anything is handed over.
    pub host_only: bool,
    /// What becomes of read-only data.
    pub read_only: ReadOnly,
    /// Whether a legacy (unversioned) capsule from its arrays' own
    /// `__dlpack__` is memory the framework itself may write: true where
    /// the framework has no read-only arrays (PyTorch, CuPy, PaddlePaddle)
    /// or refuses to export them as legacy capsules (NumPy, and
    /// array_api_strict, whose `__dlpack__` is NumPy's), so that a legacy
    /// capsule of it says no less than a versioned one would. Any other
    /// legacy capsule (an immutable framework's, an unknown producer's, a
    /// capsule passed without its array) is imported read-only: it cannot
    /// say whether it may be written.
    pub legacy_writable: bool,
    /// What becomes of layouts it cannot take.
    pub layout: Layout,
    /// How it converts its own arrays.
    pub convert: Convert,
    /// Its array type in a stub.
    pub stub: Stub,
}

macro_rules! frameworks {
    ($($(#[$doc:meta])* $id:ident {
        option: $option:literal,
        modules: [$($module:literal),*],
        python_type: $python_type:literal,
        name: $name:literal,
        handover: $handover:ident($hmodule:literal, $hfunc:literal),
        host_only: $host_only:literal,
        read_only: $read_only:ident,
        legacy_writable: $legacy_writable:literal,
        layout: $layout:ident,
        convert: $convert:ident,
        stub: $stub:literal [$($import:literal),*] typed: $typed:literal,
    })*) => {
        /// A framework a `#[dlpack_fn(returns = ...)]` function hands its
        /// arrays to, or whose array an argument is (`returns = like(x)`).
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Framework {$($(#[$doc])* $id,)*}

        /// The frameworks dlcast knows by name, in the order of
        /// [`Framework`]'s variants.
        pub const FRAMEWORKS: &[FrameworkFacts] = &[$(FrameworkFacts {
            id: Framework::$id,
            option: $option,
            returns: concat!("returns = ", $option),
            modules: &[$($module),*],
            python_type: $python_type,
            name: $name,
            handover: Handover::$handover { module: $hmodule, func: $hfunc },
            host_only: $host_only,
            read_only: ReadOnly::$read_only,
            legacy_writable: $legacy_writable,
            layout: Layout::$layout,
            convert: Convert::$convert,
            stub: Stub { ty: $stub, imports: &[$($import),*], typed: $typed },
        }),*];
    };
}

frameworks! {
    /// `numpy.from_dlpack`.
    Numpy {
        option: "numpy", modules: ["numpy"], python_type: "numpy.ndarray", name: "NumPy",
        handover: NumpyCApi("numpy", "from_dlpack"), host_only: true,
        read_only: Marked, legacy_writable: true, layout: AsIs,
        convert: NumpyAstype,
        stub: "numpy.typing.NDArray[typing.Any]" ["numpy", "numpy.typing"] typed: true,
    }
    /// `torch.from_dlpack`.
    Torch {
        option: "torch", modules: ["torch"], python_type: "torch.Tensor", name: "PyTorch",
        handover: TorchExchange("torch", "from_dlpack"), host_only: false,
        read_only: Refused, legacy_writable: true, layout: NegativeStridesRefused,
        convert: TorchTo,
        stub: "torch.Tensor" ["torch"] typed: true,
    }
    /// `jax.numpy.from_dlpack`.
    Jax {
        option: "jax", modules: ["jax", "jaxlib"], python_type: "jax.Array", name: "JAX",
        handover: FromDlpack("jax.numpy", "from_dlpack"), host_only: false,
        read_only: Immutable, legacy_writable: false, layout: CompactCopy,
        convert: JaxAstype,
        stub: "jax.Array" ["jax"] typed: true,
    }
    /// `cupy.from_dlpack`.
    Cupy {
        option: "cupy", modules: ["cupy"], python_type: "cupy.ndarray", name: "CuPy",
        handover: FromDlpack("cupy", "from_dlpack"), host_only: false,
        read_only: Marked, legacy_writable: true, layout: AsIs,
        convert: NumpyAstype,
        stub: "cupy.ndarray" ["cupy"] typed: false,
    }
    /// `tensorflow.experimental.dlpack.from_dlpack` (takes a capsule).
    Tensorflow {
        option: "tensorflow", modules: ["tensorflow"], python_type: "tensorflow.Tensor",
        name: "TensorFlow",
        handover: LegacyCapsule("tensorflow.experimental.dlpack", "from_dlpack"),
        host_only: false, read_only: Immutable, legacy_writable: false, layout: AsIs,
        convert: TensorflowCast,
        stub: "tensorflow.Tensor" ["tensorflow"] typed: false,
    }
    /// `array_api_strict.from_dlpack`.
    ArrayApi {
        option: "array_api", modules: ["array_api_strict"],
        python_type: "array_api_strict.Array", name: "array_api_strict",
        handover: FromDlpack("array_api_strict", "from_dlpack"), host_only: false,
        read_only: Marked, legacy_writable: true, layout: AsIs,
        convert: NamespaceAstype,
        stub: "array_api_strict._array_object.Array" ["array_api_strict._array_object"]
            typed: true,
    }
    /// A built-in `memoryview` over the exported array (the buffer
    /// protocol: host memory, dtypes with a `struct` format).
    Memoryview {
        option: "memoryview", modules: [], python_type: "memoryview", name: "memoryview",
        handover: Buffer("builtins", "memoryview"), host_only: true,
        read_only: Marked, legacy_writable: false, layout: AsIs,
        convert: NumpyOnly,
        stub: "memoryview" [] typed: true,
    }
    /// `mlx.core.from_dlpack` (MLX arrays are immutable).
    Mlx {
        option: "mlx", modules: ["mlx"], python_type: "mlx.core.array", name: "MLX",
        handover: FromDlpack("mlx.core", "from_dlpack"), host_only: false,
        read_only: Immutable, legacy_writable: false, layout: NegativeStridesCopied,
        convert: NumpyOnly,
        stub: "mlx.core.array" ["mlx.core"] typed: false,
    }
    /// `paddle.from_dlpack` (PaddlePaddle, which like PyTorch has no
    /// read-only tensors).
    Paddle {
        option: "paddle", modules: ["paddle"], python_type: "paddle.Tensor",
        name: "PaddlePaddle",
        handover: FromDlpack("paddle", "from_dlpack"), host_only: false,
        read_only: Refused, legacy_writable: true, layout: NegativeStridesRefused,
        convert: NumpyOnly,
        stub: "paddle.Tensor" ["paddle"] typed: true,
    }
}

impl Framework {
    /// This framework's row of [`FRAMEWORKS`].
    #[doc(hidden)]
    pub const fn facts(self) -> &'static FrameworkFacts {
        &FRAMEWORKS[self as usize]
    }
}

// Each row sits at its variant's index (the macro writes them in the same
// order; checked at compile time all the same). An immutable framework's
// legacy capsules are never writable: its arrays must not change.
const _: () = {
    let mut i = 0;
    while i < FRAMEWORKS.len() {
        assert!(FRAMEWORKS[i].id as usize == i);
        assert!(
            !(FRAMEWORKS[i].legacy_writable
                && matches!(FRAMEWORKS[i].read_only, ReadOnly::Immutable))
        );
        i += 1;
    }
};

/// The row of [`DTYPES`] with this DLPack code and bits (lanes 1), found
/// by a scan (constant evaluation and the macro; the runtime indexes it).
pub const fn dtype_row(code: u8, bits: u8) -> Option<usize> {
    let mut i = 0;
    while i < DTYPES.len() {
        if DTYPES[i].code == code && DTYPES[i].bits == bits {
            return Some(i);
        }
        i += 1;
    }
    None
}

// No two rows describe the same `(code, bits)` or name.
const _: () = {
    let mut i = 0;
    while i < DTYPES.len() {
        assert!(matches!(dtype_row(DTYPES[i].code, DTYPES[i].bits), Some(j) if j == i));
        assert!(DTYPES[i].bits % 8 == 0);
        i += 1;
    }
};
