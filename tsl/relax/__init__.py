"""tsl inside TVM's Relax pipelines.

    ex = tvm.compile(mod, target=tsl.relax.tvm_target("cpu"),
                     relax_pipeline=tsl.relax.pipeline("cpu"),
                     tir_pipeline=tsl.relax.tir_pipeline("cpu"))
    print(tsl.relax.report(mod, "cpu"))

`pipeline(target)` is TVM's default Relax pipeline for the target, with the imported graph's
batch norms folded into its convs first (`tsl.relax.imports`), a prefix of its convs made
channels-last where the cost model prices that lower, conversions included
(`tsl.relax.channels_last`, on back ends offering NHWC), the channels-last 3x3 stride-1
convs the model prices lower so made Winograd F(2x2, 3x3) transforms around a batch GEMM
(`tsl.relax.winograd`), and one pass added right after
operator fusion: every fused PrimFunc that computes a matmul / linear / batch matmul /
conv2d (with the bias add, relu and requantize after it) is recognized from its blocks
(`tsl.relax.match`), built with tsl's schedule for the target's machine (or the best record of
a tuning database) and swapped in (`tsl.relax.swap`); then the activations' layouts are planned
across consecutive kernels (`tsl.relax.layouts`: no crop / pad copies between them); everything
else is TVM's. `tir_pipeline(target)` is the TIR pipeline the back end lowers functions with
(the CPU's adds the passes its kernels are built with: without it a model's GEMMs lose their
weight prefetch).

For a machine whose back end runs a model's layers as calls of its own programs
(`Backend.relax_offload`: VTA), `pipeline("vta")` partitions a quantized model instead
(`tsl.relax.vta_run`), `tvm_target("vta")` is the host CPU's target, `report(mod, "vta")` says
which layers go to the machine and why the rest stays on the CPU, and
`run_vta(ex, x)` runs the compiled model with those layers in the simulator.
"""

from __future__ import annotations

from .channels_last import channels_last_pass
from .imports import fold_batch_norm, import_passes
from .layouts import layout_pass
from .entry import one_dispatch
from .quantize import quantize
from .reshapes import injective_reshapes
from .swap import Decision, Report, swap_pass
from .winograd import winograd_pass
from .targets import machine_for, tir_pipeline, tvm_target
from .vta_run import run_vta


def _stages(tvm_tgt, machine=None):
    """TVM's default Relax pipeline for `tvm_tgt`, as (before fusion ends, after) pass lists;
    with `machine`, the graph's layout plan for it (`channels_last`) and the Winograd convs it
    prices lower (`winograd`) after the import passes."""
    from tvm.relax.backend.cpu_generic import pipeline as cpu
    from tvm.relax.backend.cuda import pipeline as cuda

    from tvm.relax.transform import FastMathTransform

    be = {"llvm": cpu, "cuda": cuda}[tvm_tgt.kind.name]
    legal = be.legalize_passes(tvm_tgt)
    # exp / erf / tanh (softmax, gelu) as TVM's polynomial fast_* versions: they vectorize, where
    # expf calls do not; relative error ~1e-7, within the 1e-4 the models are checked to.
    fast = [FastMathTransform()]
    fuse_end = 1 + max(i for i, p in enumerate(legal) if "FuseTIR" in str(p.info.name))
    # Reshapes over a symbolic extent fuse as they do in a static build (`reshapes`).
    annotated = 1 + next(i for i, p in enumerate(legal)
                         if "AnnotateTIROpPattern" in str(p.info.name))
    legal = legal[:annotated] + [injective_reshapes()] + legal[annotated:]
    fuse_end += 1
    plan = [] if machine is None else [channels_last_pass(machine), winograd_pass(machine)]
    return (import_passes() + plan + fast + be.library_dispatch_passes(tvm_tgt)
            + legal[:fuse_end],
            legal[fuse_end:] + be.dataflow_lower_passes(tvm_tgt) + be.finalize_passes(tvm_tgt))


def pipeline(target, database=None, reports: list | None = None,
             upper_bounds: dict | None = None):
    """TVM's default Relax pipeline for `target` with tsl's kernels swapped in after fusion.

    `target`: a TVM Target (or its JSON dict / kind string) or a tsl target name ("cpu",
    "tensorcore-sm90"). `database`: a `tsl.tune.Database` (its best record per operator) or a
    dict of knob values, passed to `tsl.build(..., knobs=database)`. `reports`: a list that
    receives the `Report` of each run. `upper_bounds`: symbol name -> the largest value of a
    symbolic dim (`{"seq": 512}`) the model's own annotations (`tir_var_upper_bound`, which
    `torch.export` writes for `Dim(..., max=N)`) do not bound: a function with a symbolic dim
    becomes micro-kernels dispatched on its run-time value (`tsl.relax.symbolic`)."""
    import tvm

    offload = _offload(target)
    if offload is not None:  # a back end that runs the layers as calls of its programs
        from .vta_run import offload_pipeline

        return offload_pipeline(offload, reports=reports)
    tgt = tvm_target(target)
    before, after = _stages(tgt, machine_for(target))
    swap = [swap_pass(target, database, reports, upper_bounds), layout_pass()]
    vector = _vector_pass(target, tgt, upper_bounds)

    @tvm.transform.module_pass(opt_level=0, name="tsl.relax.pipeline")
    def _pipeline(mod, _ctx):
        with tgt:
            return tvm.transform.Sequential(before + swap + vector + [one_dispatch()] + after
                                            + [_one_pointer_noalias()])(mod)

    return _pipeline


def _offload(target):
    """The machine of `target` when its back end runs a model's layers as calls of its own
    programs (`Backend.relax_offload`), else None."""
    from ..backend import get_backend
    from ..tam import Machine
    from .targets import _tsl_name

    if not (isinstance(target, Machine) or _tsl_name(target)):
        return None
    m = machine_for(target)
    return m if get_backend(m.backend).relax_offload(m) else None


def _one_pointer_noalias():
    """A pass marking `tirx.noalias` every PrimFunc with at most one pointer parameter (the
    Relax VM's shape functions on its shape heap, `compute_symbolic_expr`): with one pointer
    nothing can alias, and TVM 0.27's LLVM code generation, given one function without the
    attribute in a module, tags every load and store of the module's kernels with one TBAA
    type ("tvm-alias"). LLVM then keeps a GEMM's accumulators stored to memory and its
    operands reloaded on every step: the dynamic-seq BERT layer's kernels ran 1.3-2x their
    static build's (benchmarks/README.md, dyn38). Only models with a symbolic dim have such
    functions."""
    import tvm
    from tvm import tirx

    def pointers(f) -> int:  # buffers, and handles of a lowered function
        return sum(1 for p in f.params
                   if hasattr(p.ty, "shape") or str(getattr(p.ty, "dtype", "")) == "handle")

    @tvm.transform.module_pass(opt_level=0, name="tsl.relax.OnePointerNoAlias")
    def noalias(mod, _ctx):
        for gv, f in list(mod.functions.items()):
            if (isinstance(f, tirx.PrimFunc) and pointers(f) <= 1
                    and not (f.attrs and f.attrs.get("tirx.noalias"))):
                mod[gv] = f.with_attr("tirx.noalias", True)
        return mod
    return noalias


def _vector_pass(target, tgt, upper_bounds: dict | None = None) -> list:
    """`schedule_rest` with the target machine's vector facts (CPU targets; none elsewhere yet)
    and the caller's `upper_bounds`."""
    if tgt.kind.name != "llvm":
        return []
    from ..backend import get_backend
    from .schedule_rest import schedule_rest

    machine = machine_for(target)
    return [schedule_rest(get_backend(machine.backend).vector_facts(machine),
                          bounds=upper_bounds)]


def report(mod, target, database=None, upper_bounds: dict | None = None) -> Report:
    """Which calls of `mod` tsl takes (operator, schedule, knobs) and which it leaves to TVM and
    why, for `target`, and for every other function the rule that schedules it (`rest`: a tsl
    vector rule on CPUs, a dlight GPU rule on Tensor Core targets; UNSCHEDULED when none): TVM's legalization and fusion are run on a copy, then the bridge's
    planning (the kernels are built; builds are cached for the compile that follows)."""
    import tvm

    from .schedule_rest import rest_schedules
    from .swap import plan

    offload = _offload(target)
    if offload is not None:
        from .vta_run import offload_report

        return offload_report(mod, offload)
    tgt = tvm_target(target)
    before, _ = _stages(tgt, machine_for(target))
    with tgt:
        fused = tvm.transform.Sequential(before)(mod)
    rep = plan(fused, machine_for(target), database, upper_bounds)[1]
    taken = {d.function for d in rep.taken}
    rep.rest = {n: r for n, r in rest_schedules(mod, target).items() if n not in taken}
    return rep


__all__ = ["pipeline", "report", "quantize", "run_vta", "swap_pass", "layout_pass", "fold_batch_norm", "machine_for", "tvm_target", "Report", "Decision"]
