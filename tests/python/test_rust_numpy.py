"""dlcast's views and rust-numpy's borrows (`PyReadonlyArray`,
`PyReadwriteArray`) of the same NumPy array see each other (README, Safety;
`borrow::rnp` in the runtime).

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
