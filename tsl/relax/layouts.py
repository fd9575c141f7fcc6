"""Layouts planned across tsl's kernels: the pass run right after the swap.

The swap (`tsl.relax.swap`) rewrites each call on its own: a kernel whose schedule pads the
output channels (a 24-channel conv written as 32 channels, a 1000-column FC as 1008) is
followed by a crop, and a kernel that takes such a tensor as its residual pads it back. Between
two tsl kernels those are copies of the whole activation that exchange nothing. This pass reads
the swap's tags (`swap.LAYOUT_ATTR`) and plans the edges of the graph instead:

* crop(k) -> pad(.) into a residual operand of k's padded shape: the consumer reads k itself.
  The padded lanes of a residual only reach the padded lanes of the output (an element-wise
  add), which are cropped in turn or read by another consumer of this kind; they hold the
  epilogue of a zero accumulator (zero weights and bias lanes), a finite number.
* crop(k) whose elements are a prefix of k in memory (the cropped dimension is the outermost
  one that is not 1: channels of an NCHW tensor at batch 1, columns at one row): a view of k
  (`R.memory.view`), no copy; TVM's memory planner keeps k's storage alive while the view is.
  The consumer, tsl's or TVM's (a depthwise conv, a pooling), reads the channels it always did.

A crop that cannot be a view (the padded dimension is not the outermost one) stays one copy on
that edge, and so does the crop at the graph's exit: the function's result stays a tensor of
its own rather than a view of a buffer that the memory planner might hand to a later call.
Everything else (weights, blocked packs, tails) is left as the swap wrote it.
"""

from __future__ import annotations

from .swap import LAYOUT_ATTR, OPERAND_ATTR


def layout_pass():
    """The Relax module pass: run it right after `tsl.relax.swap.swap_pass`."""
    import tvm

    @tvm.transform.module_pass(opt_level=0, name="tsl.relax.Layouts")
    def _layouts(mod, _ctx):
        return plan_layouts(mod)

    return _layouts


def layout_tags(mod) -> dict:
    """PrimFunc name -> (kind, operand) of the layout functions the swap added."""
    from tvm import tirx

    return {gv.name_hint: (str(f.attrs[LAYOUT_ATTR]),
                           str(f.attrs[OPERAND_ATTR]) if OPERAND_ATTR in f.attrs else None)
            for gv, f in mod.functions.items()
            if isinstance(f, tirx.PrimFunc) and f.attrs is not None and LAYOUT_ATTR in f.attrs}


def layout_calls(mod) -> dict:
    """How many call sites each kind of layout function has in `mod` ("pad", "pack", "crop",
    "tail"), and "view": the `R.memory.view`s this pass put in their place."""
    import tvm
    import tvm_ffi
    from tvm import relax

    tags, counts = layout_tags(mod), {}
    call_tir, view = tvm.ir.Op.get("relax.call_tir"), tvm.ir.Op.get("relax.memory.view")

    def on_call(c):
        kind = ("view" if c.op.same_as(view) else
                tags.get(c.args[0].name_hint, (None,))[0] if c.op.same_as(call_tir) else None)
        if kind is not None:
            counts[kind] = counts.get(kind, 0) + 1

    for _, f in mod.functions.items():
        if isinstance(f, relax.Function):
            tvm_ffi.structural_walk(f.body, [(relax.Call, on_call)], order="pre")
    return counts


def plan_layouts(mod):
    """`mod` with the crop / pad pairs between tsl kernels cancelled and the prefix crops made
    views (see the module docstring); the layout functions left uncalled are dropped."""
    from tvm import relax

    tags = layout_tags(mod)
    if not tags:
        return mod
    out = mod
    for gv, f in mod.functions.items():
        if isinstance(f, relax.Function):
            planner = _planner(out, tags, _crops(f, tags), _exits(f))
            out = _updated(planner, gv, f)
    return relax.transform.DeadCodeElimination()(out)


def _updated(planner, gv, f):
    planner.builder_.update_func(gv, planner.visit_expr(f))
    return planner.builder_.get()


def _crops(func, tags) -> dict:
    """Relax var -> the kernel output it crops, for the bindings of `func` that call a crop
    (or alias such a var: the frontends bind every result to a name of its own)."""
    import tvm
    from tvm import relax

    call_tir = tvm.ir.Op.get("relax.call_tir")
    crops = {}
    for block in func.body.blocks:
        for b in block.bindings:
            v = b.value
            if (isinstance(b, relax.VarBinding) and isinstance(v, relax.Call)
                    and v.op.same_as(call_tir) and tags.get(v.args[0].name_hint, ("",))[0]
                    == "crop"):
                crops[b.var] = v.args[1].fields[0]
            elif isinstance(v, relax.Var):
                k = next((k for c, k in crops.items() if c.same_as(v)), None)
                if k is not None:
                    crops[b.var] = k
    return crops


def _exits(func) -> list:
    """The vars whose value `func` returns (through aliases and tuples)."""
    import tvm_ffi
    from tvm import relax

    out = []
    tvm_ffi.structural_walk(func.body.body, [(relax.Var, out.append)], order="pre")
    for block in reversed(list(func.body.blocks)):
        for b in reversed(list(block.bindings)):
            if any(b.var.same_as(v) for v in out) and isinstance(b.value, (relax.Var,
                                                                          relax.Tuple)):
                tvm_ffi.structural_walk(b.value, [(relax.Var, out.append)], order="pre")
    return out


def _shape(expr) -> tuple:
    return tuple(int(d) for d in expr.ty.shape)


def is_prefix(shape, padded) -> bool:
    """True when the row-major tensor of `shape`, the corner of a row-major `padded`, is its
    first elements: every dimension after the outermost one that is not 1 is whole."""
    dims = [i for i, d in enumerate(shape) if d != 1]
    first = dims[0] if dims else len(shape)
    return len(shape) == len(padded) and all(shape[i] == padded[i]
                                             for i in range(first + 1, len(shape)))


def _planner(mod, tags, crops, exits):
    """The mutator that rewrites one function's layout calls."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    call_tir = tvm.ir.Op.get("relax.call_tir")

    def source(var):
        """The kernel output that `var` crops, when it is a crop's result."""
        return next((k for v, k in crops.items() if v.same_as(var)), None)

    @mutator
    class Planner(PyExprMutator):
        def visit_var_binding_(self, binding):
            self.exit = any(binding.var.same_as(v) for v in exits)
            super().visit_var_binding_(binding)

        def visit_call_(self, call):
            if not (call.op.same_as(call_tir) and call.args[0].name_hint in tags):
                return super().visit_call_(call)
            kind, operand = tags[call.args[0].name_hint]
            arg = call.args[1].fields[0]
            same = (str(arg.ty.dtype) == str(call.ty.dtype))
            k = source(arg) if kind == "pad" else None
            if (k is not None and same and (operand or "").startswith("residual")
                    and _shape(k) == _shape(call) and str(k.ty.dtype) == str(call.ty.dtype)
                    and len(_shape(arg)) == len(_shape(k))):
                return self.visit_expr(k)
            if (kind == "crop" and same and not self.exit
                    and is_prefix(_shape(call), _shape(arg))):
                return relax.op.memory.view(self.visit_expr(arg),
                                            relax.ShapeExpr(list(_shape(call))))
            return super().visit_call_(call)

    return Planner(mod)
