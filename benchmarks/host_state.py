"""Which state the host's cores are in now: what a parallel write costs over lines another core
has just read, against the same write over its own lines and over lines in DRAM.

On the 2-core Zen 4 (KVM) of stops 44-45 this cost moved between ~30 us and ~120 us for the
same 392 KB write within minutes (benchmarks/README.md, mnv45), and with it MobileNetV2: tsl
3.8-4.1 ms and ONNX Runtime 4.1-5.1 ms in the quick state, 5.5-7.1 and 7.8-8.4 ms in the
slow one. A peer read in one state against tsl read in the other says nothing about either:
run this beside each reading (`python benchmarks/host_state.py [rounds]`), and compare only
readings taken in the same state.

Each round: a kernel that writes c (rows split over the cores) timed right after itself
("own"), right after a kernel that read c in the mirrored split (each core's half read by the
other core: "other"), and after a 64 MiB pass over a NumPy array ("dram"). Medians of 20.
"""

import sys
import time

import numpy as np
import tvm
from tvm.script import tirx as T

import tsl.relax
from tsl import timing

N, C = 3136, 32  # 392 KB: a 56x56x32 fp32 activation


def _kernels(target):
    @T.prim_func
    def write(a: T.Buffer((N, C), "float32"), c: T.Buffer((N, C), "float32")):
        for i in T.parallel(N):
            for j in T.vectorized(C):
                c[i, j] = a[i, j] * T.float32(2)

    @T.prim_func
    def read_mirrored(c: T.Buffer((N, C), "float32"), s: T.Buffer((N, C), "float32")):
        for i in T.parallel(N):
            for j in T.vectorized(C):
                s[i, j] = c[N - 1 - i, j] + T.float32(1)

    return [tvm.compile(tvm.IRModule({"main": f}), target=target)["main"]
            for f in (write, read_mirrored)]


def measure(rounds: int = 5) -> list[dict]:
    """Per round, its time of day ("at") and the write's median microseconds after each of the
    three histories."""
    write, read = _kernels(tsl.relax.tvm_target("cpu"))  # also sizes TVM's pool to the cores
    a, c, s = (tvm.runtime.tensor(np.random.rand(N, C).astype("float32")) for _ in range(3))
    big = np.ones(16 << 20, dtype=np.float32)

    def timed():
        t0 = time.perf_counter()
        write(a, c)
        return time.perf_counter() - t0

    out = []
    for _ in range(rounds):
        t = {"own": [], "other": [], "dram": []}
        with timing.exclusive(), timing.realtime():
            for _ in range(20):
                write(a, c)
                t["own"].append(timed())
                read(c, s)
                t["other"].append(timed())
                big += 1.0
                t["dram"].append(timed())
        out.append({"at": time.strftime("%H:%M:%S"),
                    **{k: float(np.median(v)) * 1e6 for k, v in t.items()}})
    return out


def main(rounds: int) -> None:
    print(f"{N * C * 4 // 1024} KB parallel write, medians of 20 (us): own lines / lines the "
          f"other core read / DRAM")
    for r in measure(rounds):
        print(f"{r['at']}  {r['own']:6.1f} {r['other']:7.1f} {r['dram']:6.1f}"
              f"   other/dram {r['other'] / r['dram']:.1f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
