"""Reshapes over a symbolic extent: their divisions by the symbol taken out where the loops'
ranges prove them exact (`tsl.relax.reshapes`), so that they fuse and run as plain loads."""

import numpy as np


def _reshape(src: tuple, dst: tuple):
    """TVM's legalized reshape (TOPI's, as `LegalizeOps` writes it) of `src` into `dst`."""
    from tvm import te, topi

    a = te.placeholder(src, "float32", name="a")
    return te.create_prim_func([a, topi.reshape(a, dst)])


def _symbolic_divisions(func) -> list:
    import tvm_ffi
    from tvm import tirx

    out = []
    tvm_ffi.structural_walk(func.body, [
        (tirx.FloorDiv, lambda e: out.append(e) if not isinstance(e.b, tirx.IntImm) else None),
        (tirx.FloorMod, lambda e: out.append(e) if not isinstance(e.b, tirx.IntImm) else None)],
        order="pre")
    return out


def test_a_reshape_over_a_symbolic_extent_loses_its_divisions_and_stays_correct():
    import tvm
    from tvm import tirx

    from tsl.relax.reshapes import exact

    n = tirx.Var("n", "int64")
    f = _reshape((1, 12, 64, n), (12, 64, n))
    assert _symbolic_divisions(f)   # TVM's own form: the flat index taken apart by n
    g = exact(f)
    assert g is not None and not _symbolic_divisions(g)
    lib = tvm.compile(tvm.IRModule({"main": g}), target="llvm")
    for v in (1, 5, 37):
        x = np.random.default_rng(v).standard_normal((1, 12, 64, v)).astype("float32")
        y = tvm.runtime.tensor(np.zeros((12, 64, v), "float32"))
        lib["main"](tvm.runtime.tensor(x), y)
        np.testing.assert_array_equal(y.numpy(), x.reshape(12, 64, v))


def test_a_division_the_ranges_do_not_prove_exact_is_left_and_said():
    from tvm import tirx

    from tsl.relax.reshapes import exact

    n = tirx.Var("n", "int64")
    # (2n,) -> (2, n): the flat index is taken apart by 2n, which no loop's range bounds
    assert exact(_reshape((2 * n,), (2, n))) is None
