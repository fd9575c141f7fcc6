"""`python -m tsl.bench --dynamic`'s VTA rows: the issue's dense families (int8, bias +
requantize(8)) on vta-1x16x16, one build each, against a static build of every value, in
simulated cycles (deterministic: no timing lock). A value's cycles are the sum of the calls
its plan makes (`DynamicArtifact.pieces`); DRAM bytes beside them, which the cycle model
overlaps with compute but a plan of many calls multiplies (each call loads the weights).
Values up to VERIFY run on random inputs in the simulator against NumPy as well (bit-exact
or not)."""

from __future__ import annotations

import time

from .dynamic import QUICK_VALUES, VALUES, spread

MACHINE = "vta-1x16x16"
SHAPES = ((768, 3072), (3072, 768), (768, 2304))
VERIFY = 128  # larger values take the simulator tens of seconds per family


def families(upper: int):
    import tsl
    from tsl.ops import sym

    m = sym("m", upper=upper)
    return [(f"dense {k}->{n} int8", tsl.ops.dense(m, k, n, dtype="int8",
                                                    epilogue=tsl.ops.bias()
                                                    + tsl.ops.requantize(8)))
            for k, n in SHAPES]


def _cycles_and_bytes(estimates) -> tuple[int, int]:
    return (sum(e.cycles for e in estimates),
            sum(int(sum(e.traffic.values())) for e in estimates))


def row(name, fam, art, v: int) -> dict:
    import tsl

    calls = art.pieces(v)
    dyn, dyn_bytes = _cycles_and_bytes([art.kernels[k].artifact.estimate() for k, _ in calls])
    static, static_bytes = _cycles_and_bytes([tsl.build(fam.at(m=v), MACHINE).estimate()])
    ok = art.verify(m=v)[0] if v <= VERIFY else None
    return {"family": name, "value": v, "dynamic_cycles": dyn, "static_cycles": static,
            "ratio": dyn / static, "calls": len(calls), "dynamic_bytes": dyn_bytes,
            "static_bytes": static_bytes, "verified": ok}


def main(quick: bool = False, upper: int = 2048) -> list[dict]:
    import tsl
    from tsl.backend import resolve_target

    resolve_target(MACHINE)
    rows = []
    for name, fam in families(upper)[:1] if quick else families(upper):
        t0 = time.perf_counter()
        art = tsl.build(fam, MACHINE)
        compile_s = time.perf_counter() - t0
        print(f"\n{name} on {MACHINE}: one build {compile_s:.1f} s, {len(art.kernels)} "
              f"kernels (simulated cycles)", flush=True)
        print(f"  {'value':>6} {'dynamic':>11} {'static':>11} {'dyn/static':>10} {'calls':>5} "
              f"{'DRAM MB dyn/static':>18} {'ok':>3}", flush=True)
        ratios = []
        for v in QUICK_VALUES if quick else VALUES:
            r = row(name, fam, art, v)
            r["compile_s"] = compile_s
            rows.append(r)
            ratios.append(r["ratio"])
            ok = {True: "yes", False: "NO", None: "-"}[r["verified"]]
            print(f"  {v:>6} {r['dynamic_cycles']:>11,} {r['static_cycles']:>11,} "
                  f"{r['ratio']:>10.3f} {r['calls']:>5} "
                  f"{r['dynamic_bytes'] / 1e6:>8.1f} / {r['static_bytes'] / 1e6:<7.1f} "
                  f"{ok:>3}", flush=True)
        print(f"  {spread(ratios)}", flush=True)
    return rows
