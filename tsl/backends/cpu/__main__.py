"""`python -m tsl.backends.cpu detect [--refresh] | probe [-o FILE] [--name NAME]`.

detect: which machine `target="cpu"` means on this host, why, and where its rates come from
(`--refresh` measures the host again instead of reading its cached measurement).
probe: measure this host and write (or print) a CPU machine file of it.
"""

from __future__ import annotations

import argparse
import sys

from ...errors import TSLError
from ...tam.__main__ import render


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tsl.backends.cpu")
    sub = ap.add_subparsers(dest="cmd", required=True)
    detect = sub.add_parser("detect", help='which machine target="cpu" means here, and why')
    detect.add_argument("--refresh", action="store_true", help="measure this host again and "
                        "rewrite its cached measurement")
    probe = sub.add_parser("probe", help="measure this host and write a CPU machine file")
    probe.add_argument("-o", "--output", help="file to write (default: print it)")
    probe.add_argument("--name", help="machine name (default: <detected>-probed)")
    args = ap.parse_args(argv)
    from . import host, hostmachine, rates

    try:
        if args.cmd == "detect":
            if args.refresh:
                rates.measured(hostmachine.detect(probe=False), host.info(), refresh=True)
            print(hostmachine.report())
            return 0
        m, text = hostmachine.probe_file(args.name)
    except TSLError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
        print(f"wrote {args.output}: {render(m)}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
