"""Reshapes over a symbolic extent as index arithmetic TVM can fuse and compile to plain loads.

TVM legalizes a reshape as the flat index of the output taken apart again: with a symbolic
extent `s` every element does div / mod by `s` (`((h * 64 + d) * s + j) // s % 768 // 64`),
which TVM's analyzer does not simplify (it cannot bound `j < s`), and `AnnotateTIROpPattern`
calls such a function opaque, so `FuseOps` fuses nothing across it. `exact` rewrites each
`(q * s + r) // s` to `q` and `(q * s + r) % s` to `r` where `0 <= r < s` is provable from the
loop and block domains (the indices a reshape writes); `injective_reshapes` marks the reshapes
so rewritten injective, as the same reshapes are in a static build. The dynamic-seq BERT
layer's 12 reshapes then fuse as in its static build (benchmarks/README.md, seq41).
"""

from __future__ import annotations

OPAQUE, INJECTIVE = 8, 2  # TVM's OpPatternKind values


def _domains(func):
    """An analyzer that knows every loop's and block iterator's range in `func`."""
    import tvm_ffi
    from tvm import ir, s_tir, tirx
    from tvm.sym.analyzer import Analyzer

    ana = Analyzer()

    def on_for(f):
        ana.bind(f.loop_var, ir.Range.from_min_extent(f.min, f.extent))

    def on_block(b):
        for iv in b.iter_vars:
            ana.bind(iv.var, iv.dom)
    tvm_ffi.structural_walk(func.body, [(tirx.For, on_for), (s_tir.SBlock, on_block)],
                            order="pre")
    return ana


def _split(x, y, ana):
    """(q, r) with x == q * y + r and 0 <= r < y provable, or None."""
    from tvm import tirx

    zero = tirx.IntImm(str(x.ty), 0)
    if ana.can_prove(x >= 0) and ana.can_prove(x < y):
        return zero, x
    if isinstance(x, tirx.Mul) and x.b.same_as(y):
        return x.a, zero
    if isinstance(x, tirx.Add):
        for a, b in ((x.a, x.b), (x.b, x.a)):
            q = _split(a, y, ana)
            if q is not None and ana.can_prove(q[1] + b >= 0) and ana.can_prove(q[1] + b < y):
                return q[0], q[1] + b
    return None


def exact(func):
    """`func` with every div / mod by a symbolic expression taken out where provable (see the
    module's text), or None where one is left."""
    import tvm_ffi
    from tvm import tirx

    ana = _domains(func)
    left = []

    def divide(e):
        if isinstance(e.b, tirx.IntImm):
            return e
        qr = _split(ana.simplify(e.a), e.b, ana)
        if qr is None:
            left.append(e)
            return e
        return ana.simplify(qr[0] if isinstance(e, tirx.FloorDiv) else qr[1])
    body = tvm_ffi.structural_map(func.body, [(tirx.FloorDiv, divide), (tirx.FloorMod, divide)])
    return None if left else func.with_body(body)


def injective_reshapes():
    """A pass (after `AnnotateTIROpPattern`, before `FuseOps`) marking injective every opaque
    reshape PrimFunc whose divisions by a symbolic extent `exact` takes out (left as it was:
    a reshape that stays alone becomes a view later, which needs TVM's own index form)."""
    import tvm
    from tvm import tirx
    from tvm.relax.analysis import has_reshape_pattern

    @tvm.transform.module_pass(opt_level=0, name="tsl.relax.InjectiveReshapes")
    def mark(mod, _ctx):
        for gv, f in list(mod.functions.items()):
            if (isinstance(f, tirx.PrimFunc) and f.attrs
                    and int(f.attrs.get("op_pattern", -1)) == OPAQUE
                    and has_reshape_pattern(f) and exact(f) is not None):
                mod[gv] = f.with_attr("op_pattern", INJECTIVE)
        return mod
    return mark
