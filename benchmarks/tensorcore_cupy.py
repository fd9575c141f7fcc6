"""Run the Tensor Core back end's kernels on an NVIDIA GPU through CuPy, check them, time them.

Two steps, so the GPU machine needs neither TVM nor nvcc:

    # where tsl, TVM and nvcc are installed (no GPU needed):
    python benchmarks/tensorcore_cupy.py export kernels/ [--target tensorcore-sm90] [--quick]
    # on the GPU machine (NumPy + CuPy; PyTorch for the cuBLAS baseline; ml_dtypes for bf16):
    python benchmarks/tensorcore_cupy.py run kernels/ [--repeat 100]

`run` loads each exported kernel (cubin for the GPU's arch, else PTX), feeds it fresh random
inputs, poisons the output before the launch, compares with a reference computed on the GPU in
float32 (float64 for int8: exact) — ||out - ref|| / ||ref|| below 1e-2 for fp16/bf16 inputs,
zero for int8 — then reports the median time over many launches (CUDA events) next to
torch.matmul / torch.nn.functional.linear (cuBLAS) or torch.nn.functional.conv2d (cuDNN, on
the NHWC data seen as channels-last NCHW) on the same inputs. Exit status 1 if any kernel is
wrong. It was written without a GPU at hand: it has not been run on one yet (the kernels' CUDA
was checked on the CPU by tests/wmma_emulator.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def export(out: Path, target: str, quick: bool) -> None:
    import tsl
    from tsl.backend import resolve_target

    backend, _ = resolve_target(target)
    for n, op in enumerate(backend.suite(quick)):
        try:
            art = tsl.build(op, target=target)
        except tsl.TSLError as e:
            print(f"skip {op}: {type(e).__name__}: {str(e).splitlines()[0]}")
            continue
        path = art.export(out / f"{n:02d}_{op.name}_{op.dtype}")
        print(f"exported {op} -> {path}")


# -- on the GPU ---------------------------------------------------------------------------------
def random_input(rng, shape, dtype):
    """(host array as the kernel reads it, the same values as float64)."""
    if dtype in ("int8", "int32"):                   # int32: a requantize epilogue's bias
        hi = 128 if dtype == "int8" else 1 << 12
        x = rng.integers(-hi, hi, size=shape).astype(dtype)
        return x, x.astype(np.float64)
    x = rng.uniform(-1, 1, size=shape).astype(np.float32)
    if dtype == "bfloat16":
        import ml_dtypes

        xb = x.astype(ml_dtypes.bfloat16)
        return xb.view(np.uint16), xb.astype(np.float64)   # CuPy has no bf16: pass the bits
    x = x.astype(dtype)
    return x, x.astype(np.float64)


def reference(cp, op, a, b, bias):
    """The operator and its epilogue on the GPU, in float64 for int8 (exact) and float32
    otherwise. conv2d is NHWC data, RSCK weights, NPQK output: a sum over the kernel window of
    (strided window of the padded input) x (the weights at that offset)."""
    ft = cp.float64 if op["dtype"] == "int8" else cp.float32
    a, b = cp.asarray(a, ft), cp.asarray(b, ft)
    if op["name"] == "conv2d":
        st, pad, dil = op["stride"], op["padding"], op["dilation"]
        R, S, _, K = b.shape
        xp = cp.pad(a, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
        P = (xp.shape[1] - dil * (R - 1) - 1) // st + 1
        Q = (xp.shape[2] - dil * (S - 1) - 1) // st + 1
        c = cp.zeros((a.shape[0], P, Q, K), ft)
        for r in range(R):
            for s in range(S):
                win = xp[:, r * dil: r * dil + st * (P - 1) + 1: st,
                         s * dil: s * dil + st * (Q - 1) + 1: st, :]
                c += cp.tensordot(win, b[r, s], axes=([3], [0]))
    else:
        c = cp.matmul(a, cp.swapaxes(b, -1, -2) if op["transpose_b"] else b)
    for step in op.get("epilogue_steps") or [{"kind": k, "value": []} for k in op["epilogue"]]:
        kind, value = step["kind"], step["value"]
        if kind == "bias":
            c = c + cp.asarray(bias, ft)              # per output channel: the last axis
        elif kind == "relu":
            c = cp.maximum(c, 0)
        elif kind == "shift":                       # arithmetic shift = floor division
            c = cp.floor(c / 2.0 ** value[0]) if value[0] >= 0 else c * 2.0 ** -value[0]
        elif kind == "clip":
            c = cp.clip(c, value[0], value[1])
    return c


def time_ms(cp, fn, repeat: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeat):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
    return float(np.median(times))


def cublas(op, host, repeat):
    """torch (cuBLAS / cuDNN) on the same inputs: (name, median ms) or None when torch is
    absent or has no such kernel."""
    try:
        import torch
    except ImportError:
        return None
    dt = {"float16": torch.float16, "bfloat16": torch.bfloat16, "int8": torch.int8}[op["dtype"]]
    a, b = (torch.from_numpy(np.ascontiguousarray(x)).view(dt).cuda() for x in host[:2])
    bias = torch.from_numpy(host[2]).cuda().to(dt) if "bias" in op["epilogue"] else None
    relu = "relu" in op["epilogue"]
    if op["name"] == "conv2d":
        if op["dtype"] == "int8":
            return None                               # no int8 conv2d in torch on CUDA
        # NHWC data / RSCK weights seen as NCHW / KCRS tensors in channels-last memory.
        x = a.permute(0, 3, 1, 2)
        w = b.permute(3, 2, 0, 1).contiguous(memory_format=torch.channels_last)

        def conv():
            return torch.nn.functional.conv2d(x, w, bias, stride=op["stride"],
                                              padding=op["padding"], dilation=op["dilation"])
        fn = (lambda: torch.relu(conv())) if relu else conv
        name = "F.conv2d" + ("+relu" if relu else "")
    elif op["dtype"] == "int8":
        if a.dim() != 2 or op["transpose_b"]:
            return None
        fn, name = (lambda: torch._int_mm(a, b)), "torch._int_mm"
    elif op["transpose_b"]:
        fn = (lambda: torch.relu(torch.nn.functional.linear(a, b, bias))) if relu else \
            (lambda: torch.nn.functional.linear(a, b, bias))
        name = "F.linear" + ("+relu" if relu else "")
    else:
        fn, name = (lambda: torch.matmul(a, b)), "torch.matmul"
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for i in range(repeat + 3):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        if i >= 3:
            times.append(start.elapsed_time(end))
    return name, float(np.median(times))


def run(root: Path, repeat: int, seed: int | None) -> int:
    import cupy as cp

    from tsl.backends.cuda_tensorcore.runtime import CupyKernel

    rng = np.random.default_rng(seed)
    bad = 0
    print(f"GPU: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}")
    for path in sorted(p for p in root.iterdir() if (p / "kernel.json").exists()):
        kern = CupyKernel(path)
        meta, op = kern.meta, kern.meta["op"]
        ins = [p for p in meta["params"] if p["role"] != "out"]
        host, real_host, exact = [], [], []
        for p in ins:
            # Fresh values in the operator's region, zeros in the padding the schedule added.
            real = meta["shapes"][p["role"]]
            x, x64 = random_input(rng, real, p["dtype"])
            pad = [(0, s - r) for r, s in zip(real, p["shape"])]
            host.append(np.pad(x, pad))
            real_host.append(x)
            exact.append(x64)
        dev = [cp.asarray(x) for x in host]
        out = kern.output()
        out.fill(np.nan if out.dtype.kind == "f" else np.iinfo(out.dtype).min)   # poison
        kern(*dev, out)
        cp.cuda.Device().synchronize()
        crop = tuple(slice(0, n) for n in meta["shapes"]["out"])
        got = out[crop].astype(cp.float64)
        ref = reference(cp, op, *exact[:2], exact[2] if len(exact) > 2 else None)
        err = float(cp.linalg.norm(got - ref) / max(float(cp.linalg.norm(ref)), 1e-30))
        ok = err == 0.0 if op["dtype"] == "int8" else err < 1e-2
        bad += not ok
        ms = time_ms(cp, lambda: kern(*dev, out), repeat)
        tflops = meta["flops"] / ms / 1e9
        base = cublas(op, real_host, repeat)
        vs = f"{base[0]} {base[1]:.3f} ms, ratio {base[1] / ms:.2f}x" if base else "no baseline"
        print(f"{meta['operator']:42s} {'ok ' if ok else 'BAD'} err {err:.1e}  "
              f"{ms:.3f} ms {tflops:7.1f} TFLOP/s  | {vs}")
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export", help="build and export the suite (needs tsl, TVM, nvcc)")
    e.add_argument("dir", type=Path)
    e.add_argument("--target", default="tensorcore-sm90")
    e.add_argument("--quick", action="store_true")
    r = sub.add_parser("run", help="verify and time exported kernels (needs a GPU and CuPy)")
    r.add_argument("dir", type=Path)
    r.add_argument("--repeat", type=int, default=100)
    r.add_argument("--seed", type=int, default=None, help="default: fresh inputs every run")
    args = ap.parse_args(argv)
    if args.cmd == "export":
        export(args.dir, args.target, args.quick)
        return 0
    return run(args.dir, args.repeat, args.seed)


if __name__ == "__main__":
    sys.exit(main())
