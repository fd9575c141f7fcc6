"""ONNX Runtime's own per-node times on a `--models` bench model, to set against tsl's profile.

`python benchmarks/ort_profile.py resnet18|mobilenet_v2|encoder` exports the model as the bench
does (`tsl.bench.imported`), runs it in ONNX Runtime (CPU execution provider, intra-op threads =
this host's cores) with its profiler on, 20 timed runs under the timing lock and at real-time
priority where asked for (`tsl.timing`), and prints the median run and each node's median
kernel time, largest first.
"""

import collections
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from tsl import timing
from tsl.bench.imported import cores, export_onnx, make_model

RUNS = 20


def main(name: str) -> None:
    work = Path(tempfile.mkdtemp())
    model, x = make_model(name)
    export_onnx(model, x, work / "m.onnx")
    so = ort.SessionOptions()
    so.intra_op_num_threads = cores()
    so.enable_profiling = True
    so.profile_file_prefix = str(work / "prof")
    sess = ort.InferenceSession(str(work / "m.onnx"), so, providers=["CPUExecutionProvider"])
    feed = {sess.get_inputs()[0].name: x}
    for _ in range(5):
        sess.run(None, feed)
    ts = []
    with timing.exclusive(), timing.realtime():
        for _ in range(RUNS):
            t0 = time.perf_counter()
            sess.run(None, feed)
            ts.append(time.perf_counter() - t0)
    per = collections.defaultdict(list)
    for e in json.load(open(sess.end_profiling())):
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per[e["name"][:-len("_kernel_time")]].append(e["dur"] / 1e3)
    rows = sorted(((float(np.median(v[-RUNS:])), k) for k, v in per.items()), reverse=True)
    print(f"ONNX Runtime {name}: median run {np.median(ts) * 1e3:.2f} ms, sum of the nodes' "
          f"medians {sum(m for m, _ in rows):.2f} ms")
    for m, k in rows:
        print(f"{m:8.3f} ms  {k}")


if __name__ == "__main__":
    main(sys.argv[1])
