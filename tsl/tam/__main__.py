"""`python -m tsl.tam list | show NAME|PATH [--plot FILE.png]`.

Which machine `target="cpu"` means here, and measuring this host, are the CPU back end's:
`python -m tsl.backends.cpu detect | probe [-o FILE]`.
"""

from __future__ import annotations

import argparse
import sys

from ..errors import TAMError
from . import builtin_names, load
from .machine import Machine


def render(m: Machine) -> str:
    out = [f"{m.name}  (back end {m.backend}, {m.clock_hz / 1e9:g} GHz)  {m.description}",
           f"  file: {m.source}", "  compute levels:"]
    out += [f"    {c.name:<10} {c.role:<8} x{c.count:<5} bind {c.bind or '-'}" for c in m.compute]
    out.append("  memory levels (outermost first):")
    for lv in m.memory:
        cap = (f"{lv.capacity / 2**20:g} MiB" if lv.capacity >= 2**20
               else f"{lv.capacity / 2**10:g} KiB" if lv.capacity >= 2**10 else f"{lv.capacity} B")
        out.append(f"    {lv.name:<10} {lv.role:<12} {cap:>10}  holds {','.join(lv.holds):<6} "
                   f"parent {lv.parent or '-':<8} {'' if lv.managed else '(hardware cache)'}")
    out.append("  tensor primitives:")
    for p in m.primitives:
        out.append(f"    {p.name:<18} {p.m}x{p.n}x{p.k} {p.a_dtype} x {p.b_dtype} -> {p.acc_dtype}"
                   f"  A@{p.a_level} B@{p.b_level} C@{p.c_level}  B layout {p.layout_b}  "
                   f"{p.macs_per_cycle:g} MAC/cycle")
    if m.movers:
        out.append("  movers:")
        out += [f"    {v.name:<10} {v.src} -> {v.dst}  {v.dims}-D{' +pad' if v.padding else ''}"
                f"  {v.bytes_per_cycle:g} B/cycle" for v in m.movers]
    if m.vectors:
        out.append("  vector units:")
        out += [f"    {v.name:<10} on {v.level}  {v.lanes} lanes  {','.join(v.ops)}"
                for v in m.vectors]
    if m.notes:
        out += ["  notes:"] + [f"    {n}" for n in m.notes]
    if m.peaks:
        out.append("  peaks: " + ", ".join(f"{k} {v / 1e12:g} TOP/s" for k, v in m.peaks.items()))
    if m.params.changed():
        out.append("  params: " + ", ".join(f"{k}={v}" for k, v in m.params.changed().items()))
    if m.sources:
        out += ["  sources:"] + [f"    {k}: {v}" for k, v in m.sources.items()]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tsl.tam", epilog="which machine target='cpu' "
                                 "means here, and measuring this host: python -m "
                                 "tsl.backends.cpu detect | probe")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="built-in machines")
    show = sub.add_parser("show", help="print one machine")
    show.add_argument("machine", help="a built-in name or a path to a .toml file")
    show.add_argument("--plot", metavar="PNG", help="also draw the machine's roofline (compute "
                      "ceiling per dtype, bandwidth ceiling per memory level) into this file")
    args = ap.parse_args(argv)
    if args.cmd == "list":
        print("\n".join(builtin_names()))
        return 0
    try:
        m = load(args.machine)
        print(render(m))
    except TAMError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.plot:
        from .roofline import plot

        plot(m, args.plot)
        print(f"roofline: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
