"""Run the Tensor Core back end's exported kernels on an NVIDIA GPU with CuPy: verify, time, compare.

Two steps, so the GPU machine needs neither TVM nor nvcc:

    # where tsl, TVM and nvcc are installed (no GPU needed):
    python benchmarks/tensorcore_cupy.py export kernels/ [--target tensorcore-sm90] [--quick]
    # on the GPU machine (NumPy, CuPy and PyTorch; no tsl):
    python benchmarks/tensorcore_cupy.py run kernels/ [--repeat 20] [--runs 10]

`run` prints the driver (nvidia-smi; CuPy's runtime and driver versions) and the GPU first. Each
exported kernel (a directory with kernel.json, format tsl-cuda-kernel/3: entry name, grid,
block, dynamic shared memory, parameters, the kernels to launch in order with their arguments
and the workspaces they need (a split reduction is two kernels), images, reference operator)
runs in a process of its own, so a kernel that faults (and leaves its CUDA context unusable) is reported and the run
goes on. Per kernel:

- image: the PTX when the driver can JIT its ISA version (`.version 9.0` needs a CUDA 13
  driver), else the cubin shipped for the GPU's architecture (`--image` forces one);
- inputs: fresh random values built by torch on the GPU (bf16 by rounding float32 on the
  device: no NumPy bf16, no torch.from_numpy), zero padding where the schedule padded; the
  output is poisoned (NaN / INT_MIN) before every checked launch, so an element no launch wrote
  fails;
- verified against torch on the GPU in float32 (TF32 off; float64 for int8: exact), before
  timing and again on the outputs the timed launches wrote (the outputs are poisoned before the
  back-to-back launches and again before the graph's, and checked after each). An element
  passes when |out - ref| <= 4 sqrt(K) u_acc sum_k |a_k b_k| + u_out |ref|: K the reduction
  length, u_acc the accumulator's unit roundoff (2^-23 for float32, whose Tensor Core adds may
  truncate; 0 for int32: int8 must be exact), u_out the output dtype's. Every element is
  checked: a stale 16x16 tile in a 4096^2 output fails (a norm-wise 1e-2 passed it);
- timed: the median over `--runs` runs of `--repeat` back-to-back launches between one pair of
  CUDA events (no synchronization between launches), and the same launches captured in a CUDA
  graph and replayed (no launch overhead: the number that matters for µs-scale kernels). L2 is
  flushed (a 2 x L2 buffer is zeroed) before every run; within a run the launches cycle through
  as many copies of the inputs and output as make the working set at least 2 x L2, so small
  operators are not timed on data already in L2 either;
- compared with torch on the same shapes and the SAME output dtype: torch.mm / torch.bmm /
  torch.addmm (what F.linear calls) with out_dtype=float32 for fp16/bf16, torch._int_mm for
  int8 (int32), timed the same way (events and graph). Where torch has no such kernel (no
  fp16 -> fp32 conv2d; a torch before out_dtype) its input-dtype kernel is timed, the table
  names its output dtype and prints the ratio in parentheses: not like for like.
  ratio = torch's time / tsl's (graph times when both have one): above 1, tsl is faster.

A table comes last; the exit status is 0 only when every kernel verified (before and after
timing). tests/test_gpu_script.py rehearses all this with a stand-in CuPy that runs the kernels
on the CPU emulator (tests/gpu_standin/).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FORMAT = "tsl-cuda-kernel/3"


def export(out: Path, target: str, quick: bool) -> None:
    sys.path.insert(0, str(ROOT))
    import tsl
    from tsl.backend import resolve_target

    backend, _ = resolve_target(target)
    for n, op in enumerate(backend.suite(quick)):
        try:
            art = tsl.build(op, target=target)
            path = art.export(out / f"{n:02d}_{op.name}_{op.dtype}")
        except tsl.TSLError as e:
            print(f"skip {op}: {type(e).__name__}: {str(e).splitlines()[0]}")
            continue
        print(f"exported {op} -> {path}")


# -- the machine code image -------------------------------------------------------------------
# PTX ISA version -> the first CUDA driver (cudaDriverGetVersion: 1000 major + 10 minor) that
# JIT-compiles it (the PTX ISA documentation's release notes).
PTX_ISA_DRIVER = {"7.0": 11000, "7.1": 11010, "7.2": 11020, "7.3": 11030, "7.4": 11040,
                  "7.5": 11050, "7.6": 11060, "7.7": 11070, "7.8": 11080, "8.0": 12000,
                  "8.1": 12010, "8.2": 12020, "8.3": 12030, "8.4": 12040, "8.5": 12050,
                  "8.6": 12070, "8.7": 12080, "8.8": 12090, "9.0": 13000}


def version_str(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}"


def choose_image(images: dict, arch: str, driver: int, prefer: str = "auto") -> tuple[str, str]:
    """(file, why): the PTX when the driver can JIT its ISA version, else the cubin for `arch`
    (e.g. "sm_90"); `prefer` "ptx" / "cubin" forces one. RuntimeError when neither can run."""
    ptx, cubins = images["ptx"], images["cubin"]
    need, target = PTX_ISA_DRIVER.get(ptx["isa"]), ptx["target"]
    # sm_90a code (wgmma) runs on sm_90 alone; plain sm_XY PTX on any sm_ZW >= XY.
    runs_on = arch == target[:-1] if target.endswith("a") else int(arch[3:]) >= int(target[3:])
    ptx_ok = need is not None and driver >= need and runs_on
    cubin = cubins.get(arch) or cubins.get(arch + "a")
    if prefer != "cubin" and ptx_ok:
        return ptx["file"], f"PTX ISA {ptx['isa']} JIT by driver {version_str(driver)}"
    if prefer != "ptx" and cubin:
        why = ("--image cubin" if prefer == "cubin" else
               f"driver {version_str(driver)} cannot JIT PTX ISA {ptx['isa']} (needs "
               f"{version_str(need) if need else 'a newer driver'})")
        return cubin, f"cubin {arch}: {why}"
    raise RuntimeError(f"no image runs here: PTX ISA {ptx['isa']} for {ptx['target']} needs "
                       f"driver {version_str(need) if need else '?'} (have "
                       f"{version_str(driver)}), cubins only for {sorted(cubins) or 'none'} "
                       f"(GPU is {arch}); re-export with a toolkit this driver supports")


# -- checking ---------------------------------------------------------------------------------
UNIT = {"float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8, "int32": 0.0,
        "int8": 0.0, "uint8": 0.0}
ACC_UNIT = {"float32": 2.0 ** -23, "int32": 0.0}  # Tensor Core fp32 adds may truncate
SAFETY = 4.0


def tolerance(ref_meta: dict, abs_sum, ref):
    """Per-element bound on |out - ref| (see the module's docstring); `abs_sum` is the
    operator on |inputs| (sum_k |a_k b_k| + |bias|), `ref` the reference output."""
    k = ref_meta["reduction"]
    return (SAFETY * math.sqrt(k) * ACC_UNIT[ref_meta["acc_dtype"]] * abs_sum
            + UNIT[ref_meta["out_dtype"]] * ref.abs())


def compare(out, ref, tol) -> dict:
    """Every element of `out` against `ref` within `tol` (torch tensors, any device): ok, how
    many fail, the max abs error, it over max |ref|, and the worst error / tolerance."""
    import torch

    exact = ref.dtype == torch.float64              # an int32 accumulator's reference
    out = out.to(ref.dtype) if exact else out.float()
    diff = (out - ref).abs()
    bad = ~(diff <= tol)                           # NaN (an unwritten element) fails
    finite = bool(torch.isfinite(out).all())
    max_abs = float(diff.max()) if finite else math.inf
    scale = float(ref.abs().max()) or 1.0
    ratio = diff / tol.clamp_min(1e-30)           # tol 0 (int8: exact): any error is huge
    return {"ok": not bool(bad.any()), "bad": int(bad.sum()), "max_abs": max_abs,
            "max_rel": max_abs / scale, "worst": float(ratio.max()) if finite else math.inf}


def reference(torch, ref_meta: dict, ins: dict, absolute: bool = False):
    """The operator and its epilogue in float32 (float64 for an int32 accumulator: exact) on
    the real (unpadded) inputs; with `absolute`, on |inputs| without relu / shift / clip (the
    bound of the rounding error: they do not increase it)."""
    import torch.nn.functional as F

    ft = torch.float64 if ref_meta["acc_dtype"] == "int32" else torch.float32
    a, b = ins["A"].to(ft), ins["B"].to(ft)
    if absolute:
        a, b = a.abs(), b.abs()
    if ref_meta["op"] == "conv2d":
        if ref_meta.get("layout", "NHWC") != "NHWC":
            raise ValueError(f"conv2d layout {ref_meta['layout']}: the reference knows NHWC")
        c = F.conv2d(a.permute(0, 3, 1, 2), b.permute(3, 2, 0, 1), stride=ref_meta["stride"],
                     padding=ref_meta["padding"], dilation=ref_meta["dilation"])
        c = c.permute(0, 2, 3, 1)
    else:
        c = torch.matmul(a, b.transpose(-1, -2) if ref_meta["transpose_b"] else b)
    for step in ref_meta["epilogue"]:
        kind, value = step["kind"], step["value"]
        if kind == "bias":
            bias = ins["bias"].to(ft)
            c = c + (bias.abs() if absolute else bias)  # per output channel: the last axis
        elif absolute:
            continue
        elif kind == "relu":
            c = torch.clamp(c, min=0)
        elif kind == "shift":                          # arithmetic shift = floor division
            c = torch.floor(c / 2.0 ** value[0]) if value[0] >= 0 else c * 2.0 ** -value[0]
        elif kind == "clip":
            c = torch.clamp(c, value[0], value[1])
        else:
            raise ValueError(f"epilogue step {kind!r}: the reference does not know it")
    return c.contiguous()


# -- one kernel -------------------------------------------------------------------------------
def torch_dtype(torch, name: str):
    return getattr(torch, name)  # float16, bfloat16, float32, int8, uint8, int32


def random_tensor(torch, shape, dtype: str, device, gen):
    """Fresh values on the device: uniform(-1, 1) rounded to fp16 / bf16 on the device,
    integers for int8 and for an int32 bias (requantize)."""
    if dtype in ("int8", "uint8", "int32"):
        lo, hi = {"int8": (-128, 128), "uint8": (0, 256), "int32": (-4096, 4096)}[dtype]
        return torch.randint(lo, hi, tuple(shape), generator=gen, device=device,
                             dtype=torch_dtype(torch, dtype))
    x = torch.rand(tuple(shape), generator=gen, device=device, dtype=torch.float32) * 2 - 1
    return x.to(torch_dtype(torch, dtype))


def poison(t):
    """NaN, or the integer an int8 / int32 epilogue's clip never yields."""
    import torch

    info = None if t.is_floating_point() else torch.iinfo(t.dtype)
    t.fill_(math.nan if info is None else info.min if t.dtype.is_signed else info.max)


def crop(t, shape):
    return t[tuple(slice(0, n) for n in shape)]


class Clock:
    """CUDA events on one stream (None: the current one), CuPy's or torch's."""

    def __init__(self, new_event, elapsed, stream=None):
        self.new_event, self.elapsed, self.stream = new_event, elapsed, stream

    def event(self):
        return self.new_event()

    def record(self, ev):
        ev.record(self.stream) if self.stream is not None else ev.record()

    def elapsed_ms(self, start, end) -> float:
        end.synchronize()
        return self.elapsed(start, end)


def cupy_clock(cp, stream=None) -> Clock:
    return Clock(cp.cuda.Event, cp.cuda.get_elapsed_time, stream)


def torch_clock(torch) -> Clock:
    return Clock(lambda: torch.cuda.Event(enable_timing=True), lambda s, e: s.elapsed_time(e))


def median_per_launch(clock: Clock, body, launches: int, runs: int, flush) -> float:
    """Median over `runs` of (one event pair around `body`, which issues `launches` launches
    back to back) / launches, in ms; `flush` empties L2 before each run."""
    times = []
    for _ in range(runs):
        flush()
        start, end = clock.event(), clock.event()
        clock.record(start)
        body()
        clock.record(end)
        times.append(clock.elapsed_ms(start, end) / launches)
    return float(np.median(times))


def timings(issue, n: int, runs: int, flush, eager: Clock, graph, between=None) -> dict:
    """Events around n back-to-back `issue(i)` calls, and around the replay of a CUDA graph of
    them (`graph(body)` -> (replay, clock)); `between()` runs after the first timing (a
    check of what it wrote), its result kept as "between"."""
    def body():
        for i in range(n):
            issue(i)

    body()  # warm up: module load, JIT, cuBLAS handles and workspaces
    res = {"ms": median_per_launch(eager, body, n, runs, flush)}
    if between:
        res["between"] = between()
    try:
        replay, clock = graph(body)
        replay()
        res["graph_ms"] = median_per_launch(clock, replay, n, runs, flush)
    except Exception as e:  # noqa: BLE001 - a capture failure is reported, not fatal
        res["graph_error"] = one_line(e)
    return res


def cupy_graph(cp, sync):
    def capture(body):
        stream = cp.cuda.Stream(non_blocking=True)
        sync()
        with stream:
            stream.begin_capture()
            body()
            g = stream.end_capture()
        return (lambda: g.launch(stream=stream)), cupy_clock(cp, stream)
    return capture


def torch_graph(torch):
    def capture(body):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            body()
        return g.replay, torch_clock(torch)
    return capture


def baselines(torch, ref_meta: dict, sets: list[dict]) -> list[tuple]:
    """torch's kernels for the operator on input set i, best first: (name, issue(i), out
    dtype). Those with the kernel's output dtype come first (torch >= 2.8: out_dtype=float32
    from fp16 / bf16, cuBLAS accumulating in float32); the input-dtype ones after, for a torch
    without out_dtype. Empty when torch has no such kernel (int8 conv2d, batched int8)."""
    import torch.nn.functional as F

    op, dt, out_dt = ref_meta["op"], ref_meta["dtype"], ref_meta["out_dtype"]
    epi = [s["kind"] for s in ref_meta["epilogue"]]
    relu, bias, tb = "relu" in epi, "bias" in epi, ref_meta["transpose_b"]

    def act(c):
        return torch.relu_(c) if relu else c

    def tail(c, i, dtype):  # the epilogue in torch: extra kernels, as a model would run them
        return act(c + sets[i]["bias"].to(dtype) if bias else c)
    if dt in ("int8", "uint8"):
        if op == "conv2d" or sets[0]["A"].dim() != 2:
            return []
        return [("torch._int_mm" + " (GEMM only)" * bool(epi),
                 lambda i: torch._int_mm(sets[i]["A"], sets[i]["B"].t() if tb else sets[i]["B"]),
                 "int32")]
    if op == "conv2d":
        # NHWC data / RSCK weights seen as NCHW / KCRS tensors in channels-last memory.
        xs = [s["A"].permute(0, 3, 1, 2) for s in sets]
        ws = [s["B"].permute(3, 2, 0, 1).contiguous(memory_format=torch.channels_last)
              for s in sets]
        bs = [s["bias"].to(s["A"].dtype) if bias else None for s in sets]
        return [("F.conv2d" + "+relu" * relu,
                 lambda i: act(F.conv2d(xs[i], ws[i], bs[i], stride=ref_meta["stride"],
                                        padding=ref_meta["padding"],
                                        dilation=ref_meta["dilation"])), dt)]
    out, ins = torch_dtype(torch, out_dt), torch_dtype(torch, dt)
    linear = tb and sets[0]["A"].dim() == 2               # F.linear's case: A @ B^T
    mm = torch.mm if sets[0]["A"].dim() == 2 else torch.bmm

    def b(i):
        return sets[i]["B"].transpose(-1, -2) if tb else sets[i]["B"]
    found = []
    if out_dt != dt:
        if linear and bias:
            found.append(("torch.addmm (F.linear)" + "+relu" * relu,
                          lambda i: act(torch.addmm(sets[i]["bias"].to(out), sets[i]["A"], b(i),
                                                    out_dtype=out)), out_dt))
        found.append((f"torch.{mm.__name__}" + " (F.linear)" * linear + "+bias" * bias
                      + "+relu" * relu,
                      lambda i: tail(mm(sets[i]["A"], b(i), out_dtype=out), i, out), out_dt))
    if linear:
        found.append(("F.linear" + "+relu" * relu,
                      lambda i: act(F.linear(sets[i]["A"], sets[i]["B"],
                                             sets[i]["bias"].to(ins) if bias else None)), dt))
    else:
        found.append(("torch.matmul" + "+bias" * bias + "+relu" * relu,
                      lambda i: tail(torch.matmul(sets[i]["A"], b(i)), i, ins), dt))
    return found


def load_launcher(file: Path):
    """The exported kernel's launcher module (tma_launch.py), loaded by path: no tsl here."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(file.stem, file)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_one(path: Path, args) -> dict:
    """Load, verify, time one exported kernel and its torch baseline: the table's row."""
    import cupy as cp
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False     # the reference is float32, not TF32
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    meta = json.loads((path / "kernel.json").read_text())
    row = {"kernel": meta.get("operator", path.name), "dir": path.name, "verified": False}
    if meta.get("format") != FORMAT:
        raise RuntimeError(f"manifest format {meta.get('format')!r}, this script reads "
                           f"{FORMAT!r}: re-export with this tsl")
    unsupported = [p["name"] for p in meta["params"]
                   if p.get("kind", "pointer") not in ("pointer", "tensormap")]
    if unsupported or any(c != 1 for c in meta.get("cluster", (1, 1, 1))):
        raise RuntimeError(f"launch not supported by this script: parameters {unsupported} "
                           f"are neither pointers nor tensor maps, or a cluster "
                           f"{meta.get('cluster')}")
    dev = torch.device(args.torch_device)
    cc = cp.cuda.Device().compute_capability
    file, row["image"] = choose_image(meta["images"], f"sm_{cc}",
                                      cp.cuda.runtime.driverGetVersion(), args.image)
    module = cp.RawModule(path=str(path / file))
    kernels = []  # (function, launch) in launch order
    for launch in meta["launches"]:
        fn = module.get_function(launch["kernel"])
        if launch["dynamic_shared_bytes"] > 48 * 1024:
            fn.max_dynamic_shared_size_bytes = launch["dynamic_shared_bytes"]
        kernels.append((fn, launch))
    ref_meta = meta["reference"]

    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed)
    ins = [p for p in meta["params"] if p["role"] != "out"]
    out_p = next(p for p in meta["params"] if p["role"] == "out")
    real = {p["role"]: random_tensor(torch, p["real_shape"], p["dtype"], dev, gen) for p in ins}
    padded = {}
    for p in ins:
        padded[p["role"]] = torch.zeros(tuple(p["shape"]), dtype=torch_dtype(torch, p["dtype"]),
                                        device=dev)
        crop(padded[p["role"]], p["real_shape"]).copy_(real[p["role"]])
    ref = reference(torch, ref_meta, real)
    tol = tolerance(ref_meta, reference(torch, ref_meta, real, absolute=True), ref)

    # Copies of inputs and output so that one run's working set is >= 2 x L2 (see docstring).
    per_set = sum(t.numel() * t.element_size() for t in padded.values()) + \
        math.prod(out_p["shape"]) * torch_dtype(torch, out_p["dtype"]).itemsize
    n_sets = max(1, min(args.repeat, math.ceil(2 * args.l2_bytes / per_set)))
    sets = [{r: (t if i == 0 else t.clone()) for r, t in padded.items()} for i in range(n_sets)]
    outs = [torch.empty(tuple(out_p["shape"]), dtype=torch_dtype(torch, out_p["dtype"]),
                        device=dev) for _ in range(n_sets)]
    # Workspaces (a split reduction's partial sums): one for all sets, the launches are in
    # order on one stream.
    work = {w["name"]: torch.empty(w["elements"], dtype=torch_dtype(torch, w["dtype"]),
                                   device=dev) for w in meta["workspace"]}
    ptrs = [[np.uint64(s[p["role"]].data_ptr()) for p in ins] + [np.uint64(o.data_ptr())]
            for s, o in zip(sets, outs)]
    named = [dict(zip([p["name"] for p in ins + [out_p]], ptr))
             | {n: np.uint64(w.data_ptr()) for n, w in work.items()} for ptr in ptrs]

    if "launcher" in meta:
        # Tensor-map parameters (TMA): encoded once per input set by the driver, launched
        # with cuLaunchKernel on CuPy's current stream (so graph capture sees it).
        if len(kernels) != 1:
            raise RuntimeError("a launcher kernel is one launch; kernel.json lists "
                               f"{len(kernels)}")
        tma = load_launcher(path / meta["launcher"])
        by_tensor = [{p["tensor"]: int(q) for p, q in zip(ins + [out_p], ptr)} for ptr in ptrs]
        gos = [tma.Launch(kernels[0][0].ptr, meta, b) for b in by_tensor]

        def launch(i):
            gos[i % n_sets](cp.cuda.get_current_stream().ptr)
    else:
        def launch(i):
            for fn, k in kernels:
                fn(tuple(k["grid"]), tuple(k["block"]),
                   tuple(named[i % n_sets][a] for a in k["args"]),
                   shared_mem=k["dynamic_shared_bytes"])

    def sync():
        cp.cuda.Device().synchronize()
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def check(which: list[int]) -> dict:
        sync()
        worst = None
        for i in which:
            worst = worse(compare(crop(outs[i], out_p["real_shape"]), ref, tol), worst)
        return worst

    poison(outs[0])
    launch(0)
    row["before"] = check([0])
    print(f"  {row['kernel']}: {row['image']}; before timing: {fmt_check(row['before'])}",
          flush=True)

    scratch = torch.empty(int(2 * args.l2_bytes), dtype=torch.uint8, device=dev)

    def flush():
        scratch.zero_()
        sync()
    def check_and_poison():  # what the back-to-back launches wrote; then the graph's turn
        res = check(range(n_sets))
        for o in outs:
            poison(o)
        return res
    for o in outs:
        poison(o)
    row.update(timings(launch, args.repeat, args.runs, flush, cupy_clock(cp),
                       cupy_graph(cp, sync), between=check_and_poison))
    row["after"] = worse(row.pop("between"), check(range(n_sets)) if "graph_ms" in row else None)
    print(f"  after timing ({n_sets} output copies): {fmt_check(row['after'])}; "
          f"{row['ms']:.4f} ms, graph {row.get('graph_ms', row.get('graph_error'))}", flush=True)
    row["verified"] = row["before"]["ok"] and row["after"]["ok"]
    row["tflops"] = meta["flops"] / (row.get("graph_ms") or row["ms"]) / 1e9
    row["sets"] = n_sets

    base_sets = [{r: t if i == 0 else t.clone() for r, t in real.items()} for i in range(n_sets)]
    for name, issue, base_out in baselines(torch, ref_meta, base_sets):
        try:
            row["base"] = timings(issue, args.repeat, args.runs, flush, torch_clock(torch),
                                  torch_graph(torch))
        except Exception as e:  # noqa: BLE001 - try the next; the row stands without one
            row["baseline_error"] = f"{name}: {one_line(e)}"
            continue
        row.update(baseline=name, baseline_out=base_out, same_dtype=base_out == out_p["dtype"])
        break
    return row


def one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:160]


# -- the report -------------------------------------------------------------------------------
def fmt_check(c: dict | None) -> str:
    if not c:
        return "-"
    return (f"{'ok' if c['ok'] else 'FAIL'} max abs {c['max_abs']:.1e} rel {c['max_rel']:.1e} "
            f"err/tol {c['worst']:.2g}" + ("" if c["ok"] else f" ({c['bad']} elements)"))


def ratio(row: dict) -> str:
    base = row.get("base")
    if not base:
        return "-"
    key = "graph_ms" if "graph_ms" in row and "graph_ms" in base else "ms"
    r = f"{base[key] / row[key]:.2f}x"
    return r if row.get("same_dtype") else f"({r})"


def worse(a: dict, b: dict | None) -> dict:
    if b is None:
        return a
    return a if (a["ok"], -a["worst"]) <= (b["ok"], -b["worst"]) else b


def table(rows: list[dict]) -> str:
    """One line per kernel: the check before / after timing (the worse one's max abs error,
    its relative value and the worst error / tolerance), times, rate, torch's row."""
    head = ("kernel", "image", "check", "max abs", "max rel", "err/tol", "ms", "graph ms",
            "TFLOP/s", "torch (same out dtype)", "ms", "graph ms", "ratio")
    lines = []
    for r in rows:
        if "error" in r:
            lines.append((r["kernel"], "-", "ERROR", r["error"][:90], *["-"] * (len(head) - 4)))
            continue
        c = worse(r["before"], r.get("after"))
        base = r.get("base") or {}
        name = r.get("baseline") or r.get("baseline_error", "none")
        if r.get("baseline") and not r.get("same_dtype"):
            name += f" [out {r['baseline_out']}]"
        image = r["image"].split(":")[0].replace("PTX ISA", "ptx").split(" JIT")[0]
        lines.append((r["kernel"], image,
                      "/".join("ok" if x and x["ok"] else "FAIL"
                               for x in (r["before"], r.get("after"))),
                      f"{c['max_abs']:.1e}", f"{c['max_rel']:.1e}", f"{c['worst']:.2g}",
                      f"{r['ms']:.4f}", f"{r['graph_ms']:.4f}" if "graph_ms" in r else "n/a",
                      f"{r['tflops']:.1f}", name, f"{base['ms']:.4f}" if base else "-",
                      f"{base['graph_ms']:.4f}" if "graph_ms" in base else "-", ratio(r)))
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
    out = [" | ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip()
           for line in [head] + lines]
    out.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(out + [
        "check: before / after timing; err/tol: the worst element's error over its tolerance; "
        "TFLOP/s at the graph time (events without a graph); ratio: torch's time / tsl's, "
        "(in parentheses) when torch's output dtype differs"])


def describe_gpu(cp) -> dict:
    """Print the driver and the GPU (before anything else runs); return what `run` needs."""
    smi = shutil.which("nvidia-smi")
    if smi:
        q = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total,clocks.sm,"
                            "clocks.max.sm,temperature.gpu,power.draw", "--format=csv"],
                           capture_output=True, text=True, timeout=60)
        print("nvidia-smi:", (q.stdout or q.stderr).strip().replace("\n", "\n            "))
    else:
        print("nvidia-smi: not found")
    drv, rt = cp.cuda.runtime.driverGetVersion(), cp.cuda.runtime.runtimeGetVersion()
    props = cp.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    cc = cp.cuda.Device().compute_capability
    print(f"CuPy {cp.__version__}: CUDA driver {version_str(drv)}, runtime {version_str(rt)}")
    print(f"GPU 0: {name}, sm_{cc}, {props['multiProcessorCount']} SMs, "
          f"L2 {props['l2CacheSize'] / 2 ** 20:.0f} MiB, "
          f"{props['totalGlobalMem'] / 2 ** 30:.0f} GiB")
    try:
        import torch
        print(f"torch {torch.__version__} (CUDA {torch.version.cuda})")
    except ImportError:
        print("torch: not installed (needed for the references and the baselines)")
    return {"name": name, "arch": f"sm_{cc}", "driver": version_str(drv),
            "runtime": version_str(rt), "l2_bytes": int(props["l2CacheSize"]) or 64 * 2 ** 20}


def kernel_dirs(root: Path) -> list[Path]:
    if (root / "kernel.json").exists():
        return [root]
    return sorted(p for p in root.iterdir() if (p / "kernel.json").exists())


def run(args) -> int:
    import cupy as cp

    info = describe_gpu(cp)
    args.l2_bytes = args.l2_bytes or info["l2_bytes"]
    if args.seed is None:
        args.seed = int(np.random.SeedSequence().entropy % 2 ** 31)
    print(f"seed {args.seed}; {args.repeat} launches per run, median of {args.runs} runs; L2 "
          f"flushed before each run ({2 * args.l2_bytes / 2 ** 20:.0f} MiB zeroed)", flush=True)
    rows = []
    for path in kernel_dirs(args.dir):
        print(f"{path.name}:", flush=True)
        rows.append(run_isolated(path, args) if args.isolate else run_here(path, args))
    print()
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps({"gpu": info, "seed": args.seed, "rows": rows}, indent=1))
    good = sum(r.get("verified", False) for r in rows)
    print(f"\n{good} of {len(rows)} kernels verified before and after timing"
          + ("" if good == len(rows) else "; FAILED: " + ", ".join(
              r["kernel"] for r in rows if not r.get("verified"))))
    return 0 if rows and good == len(rows) else 1


def run_here(path: Path, args) -> dict:
    try:
        return run_one(path, args)
    except Exception as e:  # noqa: BLE001 - one failing kernel must not end the run
        traceback.print_exc()
        return {"kernel": path.name, "error": one_line(e)}


def run_isolated(path: Path, args) -> dict:
    """`run_one` in a child process: a kernel that faults takes its CUDA context with it."""
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp, "row.json")
        cmd = [sys.executable, __file__, "run", str(path), "--no-isolate", "--row", str(result),
               "--repeat", str(args.repeat), "--runs", str(args.runs), "--seed", str(args.seed),
               "--image", args.image, "--torch-device", args.torch_device,
               "--l2-bytes", str(args.l2_bytes)]
        try:
            res = subprocess.run(cmd, timeout=args.timeout)
            code = res.returncode
        except subprocess.TimeoutExpired:
            code = f"timeout after {args.timeout} s"
        if result.exists():
            return json.loads(result.read_text())
        return {"kernel": path.name, "error": f"the kernel's process ended ({code}) without a row"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export", help="build and export the suite (needs tsl, TVM, nvcc)")
    e.add_argument("dir", type=Path)
    e.add_argument("--target", default="tensorcore-sm90")
    e.add_argument("--quick", action="store_true")
    r = sub.add_parser("run", help="verify and time exported kernels (needs a GPU, CuPy, torch)")
    r.add_argument("dir", type=Path, help="a directory of exported kernels, or one of them")
    r.add_argument("--repeat", type=int, default=20, help="back-to-back launches per run")
    r.add_argument("--runs", type=int, default=10, help="timed runs (the median is reported)")
    r.add_argument("--seed", type=int, default=None, help="default: fresh inputs every run")
    r.add_argument("--image", choices=("auto", "ptx", "cubin"), default="auto")
    r.add_argument("--torch-device", default="cuda",
                   help="where torch builds inputs and references; 'cpu' only with the "
                        "stand-in CuPy of tests/gpu_standin (the rehearsal)")
    r.add_argument("--l2-bytes", type=int, default=0, help="default: the GPU's L2 size")
    r.add_argument("--timeout", type=float, default=300, help="seconds per kernel")
    r.add_argument("--json", type=Path, help="also write every row, unrounded, to this file")
    r.add_argument("--no-isolate", dest="isolate", action="store_false",
                   help="run every kernel in this process")
    r.add_argument("--row", type=Path, help=argparse.SUPPRESS)  # the child's result file
    args = ap.parse_args(argv)
    if args.cmd == "export":
        export(args.dir, args.target, args.quick)
        return 0
    if args.row:                                       # a child of run_isolated
        row = run_here(args.dir, args)
        args.row.write_text(json.dumps(row))
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
