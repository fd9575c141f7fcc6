"""Whole models as users bring them, against the runtimes they would otherwise deploy.

    python -m tsl.bench --models [--profile] [--frontends torch,onnx] [--only resnet18,...]

torchvision's ResNet-18 and MobileNetV2 and `torch.nn.TransformerEncoderLayer(768, 12, 3072)`
at sequence length 128 (batch 1, fp32, random weights of a fixed seed) are imported the way TVM
users import them (`torch.export` + `from_exported_program`, or the ONNX file +
`from_onnx`), compiled with `tsl.relax.pipeline("cpu")`, and timed against PyTorch eager and
ONNX Runtime (CPU execution provider, intra-op threads = this host's cores). Every party runs
alone in a fresh process (`python -m tsl.bench.imported --party ...`): nothing else of ours runs
while it is timed, each gets the same settle pause and the same median of single calls (under
the timing lock ``TSL_TIMING_LOCK`` and the real-time policy where asked for, as the operator
bench), in REPEATS processes interleaved with the other parties' (tsl compiles in its first
and deploys the exported library in the others). The parent checks each result against
PyTorch's and prints one row per model and frontend; a row's "vs" ratios pair each repeat's
processes (`_paired`).

`--profile` adds where tsl's milliseconds go: the Relax VM's calls timed one by one
(`vm.set_instrument`), tsl's kernels apart from everything TVM compiled.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from .. import timing

MODELS = ("resnet18", "mobilenet_v2", "encoder")
PARTIES = ("tsl", "torch", "ort")
SETTLE_SECONDS = 1.0
# Fresh processes per party; their medians' median is the row's time, and a row's ratios are
# the medians of the repeats' paired ratios (`_paired`). Five: with three, one run of each on a
# shared 2-core host read up to 1.5x apart between two bench runs (2026-12-04), and a ratio
# rested on one repeat's pair where the other two disagreed.
REPEATS = 5
MIN_TIMED_SECONDS = 1.0
"""Each party's process times at least this long (and at least `rounds` calls): 20 calls of a
4 ms model are 80 ms, which one burst of a neighbour on a shared host moves as a whole."""


def cores() -> int:
    """The host's cores as the CPU back end counts them: tsl's thread pool is sized from the
    same count (`tsl.relax.tvm_target`), so every party gets as many threads."""
    from tsl.backends.cpu.host import info

    return info().cores


def make_model(name: str):
    """(torch module in eval mode, input array) with weights drawn from seed 0."""
    import torch

    torch.manual_seed(0)
    if name == "encoder":
        m = torch.nn.TransformerEncoderLayer(768, 12, 3072, dropout=0.0, batch_first=True)
        shape = (1, 128, 768)
    else:
        import torchvision

        m = getattr(torchvision.models, name)(weights=None)
        shape = (1, 3, 224, 224)
    x = np.random.default_rng(0).uniform(-1, 1, shape).astype("float32")
    return m.eval(), x


def export_onnx(model, x, path: Path) -> None:
    import torch

    with torch.no_grad():
        torch.onnx.export(model, (torch.from_numpy(x),), str(path), dynamo=True)


def relax_module(name: str, frontend: str, work: Path):
    model, x = make_model(name)
    if frontend == "onnx":
        import onnx
        from tvm.relax.frontend.onnx import from_onnx

        return from_onnx(onnx.load(str(work / f"{name}.onnx")), keep_params_in_input=False), x
    import torch
    from tvm.relax.frontend.torch import from_exported_program

    with torch.no_grad():
        ep = torch.export.export(model, (torch.from_numpy(x),))
    return from_exported_program(ep, keep_params_as_input=False), x


def median_call(fn, rounds: int) -> float:
    """Median seconds of single calls of `fn` (at least `rounds` of them, and at least
    `MIN_TIMED_SECONDS` of calls), after a warm-up call and the settle pause; the same for
    every party: under the host's timing lock (``TSL_TIMING_LOCK``: no other cooperating
    process times meanwhile) and at real-time priority where asked for (both as the operator
    bench's, `tsl.timing`)."""
    fn()
    time.sleep(SETTLE_SECONDS)
    ts = []
    with timing.exclusive(), timing.realtime():
        fn()  # the pool parked during the settle pause, woken untimed
        while len(ts) < rounds or sum(ts) < MIN_TIMED_SECONDS:
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


class _Profile:
    """Per-symbol time of a Relax VM's calls (the VM instrument: before/after each call), one
    dict per run of the model; `median()` is each symbol's median over the runs."""

    def __init__(self):
        self.runs: list[dict[str, float]] = []
        self._t0 = 0.0

    def next_run(self) -> None:
        self.runs.append({})

    def __call__(self, _func, symbol, before, _ret, *_args):
        now = time.perf_counter()
        if not self.runs:  # a warm-up call, before the first run
            return 0
        if before:
            self._t0 = now
        else:
            run = self.runs[-1]
            run[symbol] = run.get(symbol, 0.0) + now - self._t0
        return 0

    def median(self) -> dict[str, float]:
        return {k: float(np.median([r.get(k, 0.0) for r in self.runs])) for k in self.runs[0]}


def _library(name, frontend, work) -> Path:
    return work / f"{name}.{frontend}.tsl.so"


def _party_tsl(name, frontend, work, rounds, profile) -> tuple[dict, np.ndarray]:
    import tvm
    from tvm import relax

    import tsl.relax
    from tsl.relax.schedule_rest import unscheduled

    # No thread set-up of its own: tsl.relax.tvm_target("cpu") sizes TVM's pool to the cores
    # (TVM's default is half the logical CPUs on x86), as it does for any user.
    lib, info = _library(name, frontend, work), {}
    if lib.exists():
        # A later repeat deploys what the first compiled, as a user ships the library (and
        # sizes the pool as the README tells a deploying process to): the timing is of the
        # same program, without importing or compiling the model again.
        tsl.relax.tvm_target("cpu")
        ex = tvm.runtime.load_module(str(lib))
        x = np.load(work / f"{name}.input.npy")
        mod = relax_module(name, frontend, work)[0] if profile else None
    else:
        mod, x = relax_module(name, frontend, work)
        info["unscheduled"] = [f"{n}: {why}" for n, why in unscheduled(mod, "cpu")]
        t0 = time.perf_counter()
        ex = tvm.compile(mod, target=tsl.relax.tvm_target("cpu"),
                         relax_pipeline=tsl.relax.pipeline("cpu"),
                         tir_pipeline=tsl.relax.tir_pipeline("cpu"))
        info["compile_s"] = time.perf_counter() - t0
        ex.export_library(str(lib))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    xt = tvm.runtime.tensor(x)

    def call():
        return vm["main"](xt)

    seconds = median_call(call, rounds)
    out = call()
    out = out if hasattr(out, "numpy") else out[0]
    info["seconds"] = seconds
    if profile:
        prof = _Profile()
        vm.set_instrument(tvm.runtime.convert(prof) if hasattr(tvm.runtime, "convert")
                          else prof)
        # Under the same lock and priority as the timed calls, after the same warm-up and
        # settle pause: the instrumented runs are otherwise the timed ones.
        call()
        time.sleep(SETTLE_SECONDS)
        with timing.exclusive(), timing.realtime():
            call()
            for _ in range(max(5, rounds // 2)):
                prof.next_run()
                call()
        info["profile"] = prof.median()
        # The rule that scheduled each non-kernel function: "window" is tsl's own vector-unit
        # schedule of depthwise / grouped convs and pooling, told apart from the glue.
        from tsl.relax.schedule_rest import rest_schedules

        info["rules"] = {k: r for k, (r, _) in rest_schedules(mod, "cpu").items()}
    return info, out.numpy()


def _party_torch(name, rounds) -> tuple[dict, np.ndarray]:
    import torch

    torch.set_num_threads(cores())
    model, x = make_model(name)
    xt = torch.from_numpy(x)
    with torch.no_grad():
        seconds = median_call(lambda: model(xt), rounds)
        out = model(xt).numpy()
    return {"seconds": seconds}, out


def _party_ort(name, work, rounds) -> tuple[dict, np.ndarray]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = cores()
    sess = ort.InferenceSession(str(work / f"{name}.onnx"), so,
                                providers=["CPUExecutionProvider"])
    x = np.load(work / f"{name}.input.npy")
    feed = {sess.get_inputs()[0].name: x}
    seconds = median_call(lambda: sess.run(None, feed), rounds)
    return {"seconds": seconds}, sess.run(None, feed)[0]


def party_main(argv=None) -> int:
    """One party, alone in this process: its info as JSON on the last line of stdout, its
    output saved next to the model's files."""
    ap = argparse.ArgumentParser(prog="python -m tsl.bench.imported")
    ap.add_argument("--party", choices=PARTIES, required=True)
    ap.add_argument("--model", choices=MODELS, required=True)
    ap.add_argument("--frontend", choices=("torch", "onnx"), default="torch")
    ap.add_argument("--work", required=True)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args(argv)
    work = Path(a.work)
    if a.party == "tsl":
        info, out = _party_tsl(a.model, a.frontend, work, a.rounds, a.profile)
    elif a.party == "torch":
        info, out = _party_torch(a.model, a.rounds)
    else:
        info, out = _party_ort(a.model, work, a.rounds)
    np.save(work / f"{a.model}.{a.party}.{a.frontend}.npy", out)
    print(json.dumps(info))
    return 0


def _run_party(party, model, frontend, work, rounds, profile) -> dict:
    cmd = [sys.executable, "-m", "tsl.bench.imported", "--party", party, "--model", model,
           "--frontend", frontend, "--work", str(work), "--rounds", str(rounds)]
    if profile:
        cmd.append("--profile")
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        return {"error": " | ".join(tail)}
    info = json.loads(p.stdout.strip().splitlines()[-1])
    info["output"] = np.load(work / f"{model}.{party}.{frontend}.npy")
    return info


def _rel_err(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _parties(frontends) -> list[tuple[str, str]]:
    """(party, frontend) pairs: the peers run the model as PyTorch holds it, tsl once per
    frontend."""
    return [("torch", "torch"), ("ort", "torch")] + [("tsl", fe) for fe in frontends]


def _repeated(name, frontends, work, rounds, profile) -> dict:
    """Each party's runs: REPEATS fresh processes per party, interleaved, every repeat visiting
    the parties in an order rotated by one, so a slow spell of a shared host lands on all of
    them rather than on whichever ran then. tsl's profile is taken in its last run."""
    parties = _parties(frontends)
    runs = {p: [] for p in parties}
    for r in range(REPEATS):
        k = r % len(parties)
        for party, fe in parties[k:] + parties[:k]:
            prof = profile and party == "tsl" and r == REPEATS - 1
            runs[(party, fe)].append(_run_party(party, name, fe, work, rounds, prof))
    return {p: _merged(infos) for p, infos in runs.items()}


def _merged(infos: list[dict]) -> dict:
    """One party's repeats as one: the median of their medians, each repeat's (`runs`, in
    repeat order: `_paired` pairs them with the other parties') and how far apart they lay
    ((max - min) / median), the compile time of the run that compiled; the first failure
    stands for all."""
    failed = [i for i in infos if "error" in i]
    if failed:
        return failed[0]
    ms = [i["seconds"] for i in infos]
    out = dict(infos[-1])
    out["seconds"] = float(np.median(ms))
    out["runs"] = ms
    out["spread"] = (max(ms) - min(ms)) / out["seconds"]
    for k in ("compile_s", "unscheduled"):   # the run that compiled says these
        out[k] = next((i[k] for i in infos if k in i), None)
    return out


def _paired(peer: dict, mine: dict) -> float:
    """The peer's time over tsl's: the median over the repeats of the two parties' ratio in
    the same repeat. A repeat visits every party within seconds, so a slow spell of a shared
    host (minutes) divides out of each repeat's ratio; the ratio of the two medians mixes
    repeats taken in different spells (2026-12-07, Zen 4: MobileNetV2's row read 0.90x and
    1.27x ORT in two runs 35 minutes apart)."""
    return float(np.median([p / m for p, m in zip(peer["runs"], mine["runs"])]))


def run(models=MODELS, frontends=("torch", "onnx"), rounds: int = 20, profile: bool = False,
        progress=print) -> list[dict]:
    """One row per (model, frontend): tsl's, PyTorch's and ONNX Runtime's median ms, their
    spread over the repeats, tsl's compile time, relative errors to PyTorch, and with
    `profile` tsl's time per function."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="tsl-models-") as d:
        work = Path(d)
        for name in models:
            model, x = make_model(name)
            np.save(work / f"{name}.input.npy", x)
            export_onnx(model, x, work / f"{name}.onnx")
            del model
            progress(f"  {name}: {REPEATS} interleaved runs of torch, ORT, tsl "
                     f"({', '.join(frontends)} frontend) ...")
            runs = _repeated(name, frontends, work, rounds, profile)
            peers = {p: runs[(p, "torch")] for p in ("torch", "ort")}
            ref = peers["torch"].get("output")
            for fe in frontends:
                t = runs[("tsl", fe)]
                row = {"model": name, "frontend": fe, "host_cores": cores()}
                spreads = []
                for p, info in (("tsl", t), ("torch", peers["torch"]), ("ort", peers["ort"])):
                    if "error" in info:
                        row[f"{p}_error"] = info["error"]
                        continue
                    row[f"{p}_ms"] = info["seconds"] * 1e3
                    row[f"{p}_runs_ms"] = [s * 1e3 for s in info["runs"]]
                    spreads.append(info["spread"])
                    if p != "tsl" and "error" not in t:
                        row[f"vs_{p}"] = _paired(info, t)
                    if ref is not None and p != "torch":
                        row[f"{p}_rel_err"] = _rel_err(info["output"], ref)
                row["spread"] = max(spreads, default=None)
                row["compile_s"] = t.get("compile_s")
                row["unscheduled"] = t.get("unscheduled")
                if profile and "profile" in t:
                    row["profile_ms"] = {k: v * 1e3 for k, v in t["profile"].items()}
                    row["profile_rules"] = t.get("rules", {})
                rows.append(row)
    return rows


def _fmt(v, spec):
    return format(v, spec) if isinstance(v, (int, float)) else "-"


def format_rows(rows) -> str:
    head = (f"{'model':<14}{'frontend':<9}{'tsl ms':>9}{'torch ms':>10}{'ORT ms':>9}"
            f"{'vs ORT':>8}{'vs torch':>9}{'spread':>8}{'err tsl':>9}{'err ORT':>9}{'compile s':>10}")
    out = [head]
    for r in rows:
        t, o, p = r.get("tsl_ms"), r.get("ort_ms"), r.get("torch_ms")
        out.append(f"{r['model']:<14}{r['frontend']:<9}{_fmt(t, '9.2f')}{_fmt(p, '10.2f')}"
                   f"{_fmt(o, '9.2f')}{_fmt(r.get('vs_ort'), '7.2f')}x"
                   f"{_fmt(r.get('vs_torch'), '8.2f')}x"
                   f"{_fmt(100 * r['spread'] if r.get('spread') is not None else None, '7.0f')}%"
                   f"{_fmt(r.get('tsl_rel_err'), '9.1e')}{_fmt(r.get('ort_rel_err'), '9.1e')}"
                   f"{_fmt(r.get('compile_s'), '10.1f')}")
        if r.get("unscheduled") is not None:   # functions neither tsl kernel nor vector rule took
            out.append(f"    unscheduled functions: {', '.join(r['unscheduled']) or 'none'}")
        for p in PARTIES:
            if f"{p}_error" in r:
                out.append(f"    {p} failed: {r[p + '_error']}")
    return "\n".join(out)


def format_profile(row, top: int = 12) -> str:
    """tsl kernels (GEMM/conv, the Winograd convs' transforms around their batch GEMMs, then
    the window rule's depthwise convs and pooling) vs the rest, then the `top` functions by
    time."""
    prof = row.get("profile_ms") or {}
    total = sum(prof.values())
    if not total:
        return ""
    rules = row.get("profile_rules") or {}

    def kind(name):
        window = rules.get(name) in ("window", "channels_window")   # NCHW or NHWC windows
        if name.endswith("_tsl"):
            return "tsl"
        # a conv made Winograd (`tsl.relax.winograd`): its input and output transforms, with
        # the conv's epilogue fused into the latter, are the conv's own work, not glue
        return "wgd" if "winograd_" in name else "win" if window else "tvm"

    ms = {k: sum(v for n, v in prof.items() if kind(n) == k)
          for k in ("tsl", "wgd", "win", "tvm")}
    lines = [f"{row['model']} ({row['frontend']}): {total:.2f} ms in VM calls, each function's "
             f"median over the instrumented runs (timed without the instrument: "
             f"{row.get('tsl_ms') or 0:.2f} ms); tsl GEMM/conv "
             f"kernels {ms['tsl']:.2f} ms ({100 * ms['tsl'] / total:.0f}%), their Winograd "
             f"transforms {ms['wgd']:.2f} ms ({100 * ms['wgd'] / total:.0f}%), tsl window rule "
             f"(depthwise conv, pooling) {ms['win']:.2f} ms ({100 * ms['win'] / total:.0f}%), the "
             f"rest {ms['tvm']:.2f} ms ({100 * ms['tvm'] / total:.0f}%)"]
    for k, v in sorted(prof.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"    {v:8.3f} ms  {kind(k)}  {k}")
    return "\n".join(lines)


def main(only=None, frontends=("torch", "onnx"), profile=False, json_path=None,
         rounds: int = 20) -> int:
    models = [m for m in MODELS if not only or m in only]
    print(f"whole models, batch 1, fp32, {cores()} cores; each party alone in its own process, "
          f"{REPEATS} processes each, interleaved; a party's time is the median of their medians "
          f"of single calls (at least {rounds} and {MIN_TIMED_SECONDS:g} s of them), 'vs' the "
          f"median of the peer's time over tsl's in each repeat, spread the widest "
          f"(max - min) / median among a row's parties")
    rows = run(models, frontends, rounds, profile)
    print(format_rows(rows))
    if profile:
        for r in rows:
            print(format_profile(r))
    if json_path:
        Path(json_path).write_text(json.dumps(
            [{k: v for k, v in r.items()} for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(party_main())
