"""dlcast's views and rust-numpy's borrows (`PyReadonlyArray`,
`PyReadwriteArray`) of the same NumPy array see each other (README, Safety;
`borrow::rust_numpy` in the runtime).

`dlcast_rnp` (tests/rnp) is built with rust-numpy alone. Which registry
holds rust-numpy's borrows depends on who came first in the process:
rust-numpy's own (a rust-numpy extension borrowed an array before dlcast met
its first NumPy array: dlcast then also acquires its views there), or
dlcast's (dlcast published it in rust-numpy's place, already at its first
call of any kind when NumPy is imported by then). Each order runs in a
fresh interpreter; the suite's own process gets whichever came first.
"""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import dlcast_rnp as rnp
import dlcast_second as second
import dlcast_testext as ext
from conftest import run_py

SCENARIO = textwrap.dedent(
    """
    import sys

    import numpy as np

    import dlcast_rnp as rnp
    import dlcast_second as second
    import dlcast_testext as ext

    if sys.argv[1] == "rust-numpy first":
        rnp.hold_ref_and_call(np.zeros(3), lambda: None)
    elif sys.argv[1] == "dlcast first":
        ext.hold_ref_and_call(np.zeros(3), lambda: None)
    elif sys.argv[1] == "dlcast first, without a NumPy array":
        # dlcast's first call sets up its registry, and with it publishes
        # rust-numpy's table (NumPy is imported): rust-numpy's first borrow
        # finds it there rather than publishing its own.
        # (Below abi3-py311 the array.array is refused, after the set-up.)
        import array

        try:
            ext.fill_f64(array.array("d", [0.0]), 1.0)
        except BufferError:
            assert not ext.BUFFER_PROTOCOL
    # Either way rust-numpy's table now exists.
    core = "numpy.core" if np.__version__.startswith("1.") else "numpy._core"
    multiarray = sys.modules[core + ".multiarray"]
    assert hasattr(multiarray, "_RUST_NUMPY_BORROW_CHECKING_API")

    from test_rust_numpy import check_all

    check_all(rust_numpy_published=sys.argv[1] == "rust-numpy first")
    print("ok")
    """
)


def refused(exc, match, f, *args):
    try:
        f(*args)
    except exc as e:
        assert match in str(e), str(e)
    else:
        raise AssertionError(f"{f.__name__} was not refused")


def check_all(rust_numpy_published):
    """Every check, in the current process (run in both orders)."""
    a = np.zeros(4)
    noop = lambda: None  # noqa: E731

    # dlcast refuses a writable view of an array rust-numpy holds, and any
    # view of one it holds writable.
    calls = []

    def dl_mut():
        refused(BufferError, "borrowed by a rust-numpy extension", ext.hold_mut_and_call, a, noop)
        calls.append(1)

    def dl_ref():
        refused(BufferError, "this read-only view may not share it", ext.hold_ref_and_call, a, noop)
        calls.append(1)

    assert rnp.hold_ref_and_call(a, dl_mut) == (0.0, 0.0)
    assert rnp.hold_mut_and_call(a, dl_ref) == 8.0
    # Another dlcast extension, the same.
    rnp.hold_ref_and_call(a, lambda: refused(BufferError, "rust-numpy", second.fill, a, 1.0))

    # rust-numpy refuses the reverse.
    def rn_ref():
        refused(TypeError, "already borrowed", rnp.hold_ref_and_call, a, noop)
        calls.append(1)

    def rn_mut():
        refused(TypeError, "already borrowed", rnp.hold_mut_and_call, a, noop)
        calls.append(1)

    ext.hold_mut_and_call(a, rn_ref)
    ext.hold_ref_and_call(a, rn_mut)
    second.hold_and_call(a, rn_mut)
    assert len(calls) == 5

    # Readers share, either way round.
    assert ext.hold_ref_and_call(a, lambda: rnp.hold_ref_and_call(a, noop)) == (4.0, 4.0)
    assert rnp.hold_ref_and_call(a, lambda: ext.hold_ref_and_call(a, noop)) == (4.0, 4.0)

    # Disjoint parts of one array are independent.
    b = np.zeros(8)
    rnp.hold_mut_and_call(b[:4], lambda: ext.hold_mut_and_call(b[4:], noop))
    rnp.hold_mut_and_call(b[1::2], lambda: second.hold_and_call(b[::2], noop))
    assert b.tolist() == [2.0, 2.0, 2.0, 2.0, 1.0, 2.0, 1.0, 2.0]

    # Both release: after the calls (and after a refused one), each side
    # borrows writable again.
    assert rnp.hold_mut_and_call(a, noop) == 8.0
    assert ext.hold_mut_and_call(a, noop) == 4.0
    assert ext.live_borrows() == 0

    # An array whose fields change while a view holds it (its dtype, and so
    # its strides): released all the same, on both sides. A dlcast view
    # releases what it acquired (rust-numpy's own registry looks a borrow up
    # by the array's fields when it releases it, and aborts the process on
    # changed ones: the case below, with rust-numpy's registry, aborts).
    c = np.zeros(4)
    ext.hold_ref_and_call(c, lambda: setattr(c, "dtype", np.float32))
    c.dtype = np.float64
    assert rnp.hold_mut_and_call(c, noop) == 8.0
    assert ext.hold_mut_and_call(c, noop) == 4.0
    if not rust_numpy_published:
        # A rust-numpy borrow in dlcast's registry is released by the array.
        rnp.borrow_and_call(c, lambda: setattr(c, "dtype", np.float32))
        c.dtype = np.float64
        assert ext.hold_mut_and_call(c, noop) == 4.0
        assert rnp.hold_mut_and_call(c, noop) == 8.0
    assert ext.live_borrows() == 0


@pytest.mark.parametrize(
    "order", ["rust-numpy first", "dlcast first", "dlcast first, without a NumPy array"]
)
def test_each_order(order):
    out = subprocess.run(
        [sys.executable, "-c", SCENARIO, order],
        cwd=os.path.dirname(os.path.abspath(__file__)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_in_this_process():
    # No rust-numpy borrow happens in the suite's process before this
    # file's tests, so dlcast, on meeting its first NumPy array (here at the
    # latest), published the table.
    ext.hold_ref_and_call(np.zeros(1), lambda: None)
    check_all(rust_numpy_published=False)


# rust-numpy finds its table with a plain attribute look-up on NumPy's
# `multiarray` module, which consults the module type's MRO (`module`, then
# `object`) for a data descriptor *before* the module's dictionary. Such a
# descriptor, put in a builtin type's dictionary through the dictionary
# under its mappingproxy, redirects rust-numpy's look-up while the module's
# dictionary is unchanged: dlcast refuses NumPy arrays while it sees one.
DESCRIPTOR_REDIRECT = """
import gc, sys, types
import numpy as np
import dlcast_rnp as rnp
import dlcast_testext as ext
from conftest import run_py

ext.hold_ref_and_call(np.zeros(3), lambda: None)  # dlcast publishes its table
ATTR = "_RUST_NUMPY_BORROW_CHECKING_API"
stash = []

def fget(self):
    if stash:
        return stash[0]
    raise AttributeError(ATTR)

owner = {"module": types.ModuleType, "object": object}[sys.argv[1]]
gc.get_referents(owner.__dict__)[0][ATTR] = property(fget, lambda self, v: stash.append(v))
sys._clear_type_cache()

a = np.zeros(4)
seen = []

def inner():
    try:
        ext.hold_mut_and_call(a, lambda: None)
        seen.append("allowed")
    except (BufferError, RuntimeError) as e:
        seen.append("refused: " + type(e).__name__)

try:
    # rust-numpy's writable borrow (in a table of its own, made now), and
    # dlcast's &mut [f64] of the same array inside it: two live `&mut`.
    rnp.hold_mut_and_call(a, inner)
except Exception as e:
    seen.append("rust-numpy refused: " + type(e).__name__)
print(seen)
"""


@pytest.mark.hostile
@pytest.mark.parametrize("owner", ["module", "object"])
def test_rust_numpy_table_redirected_by_a_type_descriptor_is_not_trusted(owner):
    r = run_py(DESCRIPTOR_REDIRECT.replace("sys.argv[1]", repr(owner)))
    assert r.returncode == 0, r.stderr
    assert "allowed" not in r.stdout, r.stdout


@pytest.mark.hostile
@pytest.mark.parametrize("order", ["rust-numpy first", "dlcast first"])
def test_buffer_writes_from_rust_never_change_a_rust_numpy_borrow(order):
    # An ArrayBuffer's Rust writes (`fill`, `with_mut`) while rust-numpy
    # holds a PyReadonlyArray (a `&` to the elements) of the buffer's
    # exported NumPy array. In dlcast's registry (dlcast came first) the
    # borrow is entered by address and the write is refused; in
    # rust-numpy's own registry (a rust-numpy extension borrowed first) it
    # is entered by the array's base object, which the buffer's write never
    # consulted: the values changed under rust-numpy's `&` (and `with_mut`
    # lent `&mut [T]` beside it). Expected: refused in both orders.
    code = f"""
        import numpy as np, dlcast_rnp as rnp, dlcast_testext as ext
        first = {order!r}
        if first == "rust-numpy first":
            rnp.hold_ref_and_call(np.zeros(3), lambda: None)
        else:
            ext.hold_ref_and_call(np.zeros(3), lambda: None)
        b = ext.RoF64Buf(4)
        v = b.view_ro()
        refused = []
        def write(method, value):
            def cb():
                try:
                    getattr(b, method)(value)
                except BufferError as e:
                    refused.append(str(e))
            return cb
        assert rnp.hold_ref_and_call(v, write("fill", 1.0)) == (0.0, 0.0)
        assert rnp.hold_ref_and_call(v, write("fill_mut", 2.0)) == (0.0, 0.0)
        assert len(refused) == 2, refused
        # Without the borrow, both write again (in rust-numpy's order only
        # once no array is exported: dlcast cannot see its borrows).
        del v
        b.fill(1.0)
        b.fill_mut(2.0)
        assert b.view_ro().tolist() == [2.0] * 4
        print("ok")
    """
    p = run_py(code)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr[-3000:]


# rust-numpy's table is checked in phase 1 of a call; Python code that runs
# afterwards can delete the table dlcast published and have a rust-numpy
# extension (on its first borrow) publish one of its own, which that
# extension then keeps. A dlcast view must then be acquired there too (or
# refused): else a rust-numpy `&mut` and a dlcast `&mut` of one array live
# at once. Each scenario runs in a fresh interpreter: `dlcast_rnp` must not
# have borrowed an array before.
TABLE_SWAP = """
import sys
import numpy as np
import dlcast_rnp as rnp
import dlcast_testext as ext

ATTR = "_RUST_NUMPY_BORROW_CHECKING_API"
core = sys.modules[("numpy.core" if np.__version__.startswith("1.") else "numpy._core")
                   + ".multiarray"]
noop = lambda: None
ext.hold_ref_and_call(np.zeros(3), noop)  # dlcast publishes its table
assert hasattr(core, ATTR)


def rust_numpy_publishes_its_own():
    delattr(core, ATTR)
    # dlcast_rnp's first borrow: no table, so it publishes (and keeps) its own.
    rnp.hold_ref_and_call(np.zeros(1), noop)
    assert hasattr(core, ATTR)


a = np.zeros(4)
seen = []


def rust_numpy_mut():
    try:
        rnp.hold_mut_and_call(a, noop)
        seen.append("allowed")
    except TypeError as e:
        assert "already borrowed" in str(e), e
        seen.append("refused")
"""


@pytest.mark.hostile
def test_rust_numpy_table_replaced_by_a_later_arguments_dlpack_is_followed():
    # The second argument's `__dlpack__` (phase 1, after the first argument's
    # check) replaces the table; the body then lets rust-numpy borrow the
    # first argument writable.
    r = run_py(TABLE_SWAP + """
class Later:
    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, **kwargs):
        rust_numpy_publishes_its_own()
        return np.zeros(2).__dlpack__(**kwargs)


# (4.0, 2): rust-numpy's `&mut` would have written 2.0 under dlcast's.
seen.append(ext.hold_mut_with_and_call(a, Later(), rust_numpy_mut))
# And the reverse, later: rust-numpy's borrow is seen by dlcast.
refused = []
def dlcast_mut():
    try:
        ext.hold_mut_and_call(a, noop)
    except BufferError as e:
        refused.append(str(e))
assert rnp.hold_mut_and_call(a, dlcast_mut) == 8.0
assert len(refused) == 1 and "rust-numpy" in refused[0], refused
print(seen)
""")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "['refused', (4.0, 2)]", r.stdout


@pytest.mark.hostile
def test_rust_numpy_table_replaced_between_calls_is_followed():
    # Between two dlcast calls (the NumPy fast path's straight-line call).
    r = run_py(TABLE_SWAP + """
rust_numpy_publishes_its_own()
assert ext.hold_mut_and_call(a, rust_numpy_mut) == 4.0
print(seen)
""")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "['refused']", r.stdout


@pytest.mark.hostile
@pytest.mark.parametrize("method", ["fill", "fill_mut"])
def test_buffer_writes_from_rust_follow_a_replaced_rust_numpy_table(method):
    # An ArrayBuffer's Rust write (`fill`, `with_mut`) while rust-numpy
    # holds a `&` to the elements of its exported array, in the table
    # rust-numpy published after dlcast's was deleted (no dlcast call in
    # between: the buffer's own access must check).
    r = run_py(TABLE_SWAP + f"""
b = ext.RoF64Buf(4)
v = b.view_ro()
delattr(core, ATTR)
errors = []
def write():
    try:
        getattr(b, {method!r})(1.0)
    except BufferError as e:
        errors.append(str(e))
# dlcast_rnp's first borrow publishes its own table, then holds `v`.
print(rnp.hold_ref_and_call(v, write), len(errors))
""")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "(0.0, 0.0) 1", r.stdout


# rust-numpy chooses its module from `numpy.__version__` when an extension
# first uses NumPy: a 1.x version under NumPy 2 sends it to the
# `numpy.core.multiarray` shim, whose `__getattr__` forwards to
# `numpy._core.multiarray` (so it joins dlcast's table), but which gets a
# table of rust-numpy's own when the forwarded look-up fails (the table
# deleted, or warnings raised as errors). dlcast looks there too. (NumPy 2,
# as the suite runs it: under NumPy 1 the other module is `numpy._core`'s.)
FAKED_VERSION = """
import sys, warnings
import numpy as np
import dlcast_rnp as rnp
import dlcast_testext as ext

noop = lambda: None
ext.hold_ref_and_call(np.zeros(3), noop)  # dlcast publishes its table
how = sys.argv[1]
if how == "table deleted":
    delattr(sys.modules["numpy._core.multiarray"], "_RUST_NUMPY_BORROW_CHECKING_API")
elif how == "warnings are errors":
    warnings.simplefilter("error", DeprecationWarning)
np.__version__ = "1.26.0"

a = np.zeros(4)
seen = []
def dlcast_mut():
    try:
        ext.hold_mut_and_call(a, noop)
        seen.append("allowed")
    except (BufferError, RuntimeError) as e:
        seen.append(type(e).__name__)
# dlcast_rnp's first use of NumPy: it reads the faked version.
rnp.hold_mut_and_call(a, dlcast_mut)
print(seen)
"""


@pytest.mark.hostile
@pytest.mark.parametrize("how", ["table deleted", "warnings are errors"])
def test_rust_numpy_table_in_the_other_versions_module_is_not_trusted(how):
    r = run_py(FAKED_VERSION.replace("sys.argv[1]", repr(how)))
    assert r.returncode == 0, r.stderr[-3000:]
    # rust-numpy's writable borrow, in a table dlcast does not use: dlcast
    # refuses NumPy arrays (for the rest of the process).
    assert r.stdout.strip() == "['RuntimeError']", r.stdout


def test_rust_numpy_that_read_a_faked_version_joins_dlcasts_table():
    r = run_py(FAKED_VERSION.replace("sys.argv[1]", repr("forwarded")))
    assert r.returncode == 0, r.stderr[-3000:]
    # Found through the shim's `__getattr__`: one registry, the conflict seen.
    assert r.stdout.strip() == "['BufferError']", r.stdout


@pytest.mark.hostile
def test_rust_numpy_other_versions_module_replaced_is_not_trusted():
    # Not a plain module where an extension that read the other major
    # version looks: its class decides what rust-numpy's look-up returns.
    r = run_py("""
        import sys, types
        import numpy as np
        import dlcast_testext as ext
        ext.hold_ref_and_call(np.zeros(3), lambda: None)
        other = "numpy.core.multiarray" if np.__version__.startswith("2.") else "numpy._core.multiarray"
        class Fake(types.ModuleType):
            pass
        sys.modules[other] = Fake(other)
        try:
            ext.hold_ref_and_call(np.zeros(3), lambda: None)
            print("allowed")
        except RuntimeError as e:
            print("refused", other in str(e))
        del sys.modules[other]
        ext.hold_ref_and_call(np.zeros(3), lambda: None)
    """)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "refused True", r.stdout
