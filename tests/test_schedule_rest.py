"""schedule_rest's vector rules: scheduled functions compute what the unscheduled ones do."""

import numpy as np

from tsl.relax.schedule_rest import schedule_rest
from tsl.schedules.vector import VectorFacts


def _add_relu_mod():
    from tvm.script import ir as I
    from tvm.script import tirx as T

    @I.ir_module
    class Mod:
        @T.prim_func(s_tir=True)
        def main(a: T.Buffer((7, 37), "float32"), b: T.Buffer((37,), "float32"),
                 c: T.Buffer((7, 37), "float32")):
            for i, j in T.grid(7, 37):
                with T.sblock("c"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    c[vi, vj] = T.max(a[vi, vj] + b[vj], T.float32(0))
    return Mod


def test_injective_rule_parallel_vectorized_and_correct():
    import tvm

    left = []
    mod = schedule_rest(VectorFacts(vector_bits=512, cores=2), left)(_add_relu_mod())
    assert not left and "tsl.vector" in mod["main"].attrs
    text = mod["main"].script()
    assert "T.parallel" in text and "T.vectorized" in text
    lib = tvm.compile(mod, target="llvm")
    rng = np.random.default_rng(0)
    a = rng.standard_normal((7, 37)).astype("float32")
    b = rng.standard_normal(37).astype("float32")
    c = tvm.runtime.tensor(np.empty((7, 37), "float32"))
    lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), c)
    np.testing.assert_allclose(c.numpy(), np.maximum(a + b, 0), rtol=1e-6)
