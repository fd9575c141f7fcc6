"""The machine `target="cpu"` means on this host: the built-in file `host.choose` picks,
specialized to the host's cores and caches (`host.specialize`), with this host's rates
(`rates.for_host`: the file's micro-architecture table, then the cached probe); and the same
machine written out as a file (`python -m tsl.backends.cpu probe`)."""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path

from ...errors import TAMError
from ...tam.loader import load
from ...tam.machine import Machine
from ...tam.writer import dumps
from . import host, rates
from .probe import (SAMPLE_SECONDS, SAMPLES, clock_hz, fill_rate, filled_level,
                    primitive_rate, signature)


def detect(probe: bool | None = None) -> Machine:
    """The CPU machine for this host (see `host` and `rates`); `notes` give the reasons and
    `provenance` where its rates come from (`probe`: None = unless TSL_PROBE=0)."""
    h = host.info()
    m, notes = host.choose(h)
    return rates.for_host(dataclasses.replace(host.specialize(m, h), notes=tuple(notes)), h,
                          probe)


def report() -> str:
    """What `python -m tsl.backends.cpu detect` prints: the host, the machine chosen and why,
    and where its rates come from."""
    h, m = host.info(), detect()
    caches = ", ".join(f"L{c.level} {_size(c.bytes)}" for c in h.caches) or "unknown"
    return "\n".join([f"cpu -> {m.name}  ({m.source})",
                      f"  host: {h.model or '?'} ({h.arch}, LLVM cpu {h.llvm_cpu}, family "
                      f"{h.family} model {h.model_id}), {h.cores} cores, caches {caches}",
                      f"  rates: {m.provenance}"] + [f"  {n}" for n in m.notes])


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n >> 10} KiB"


def probe_file(name: str | None = None) -> tuple[Machine, str]:
    """(machine, TOML text) for this host, measured now: the detected machine with every
    measured figure replacing the file's, written so that it loads back as it is."""
    base = detect(probe=False)
    h = host.info()
    filled, fill = filled_level(base), fill_rate(base)
    measured = rates.Measurement(clock_hz(base), {signature(p): primitive_rate(base, p)
                                                  for p in base.primitives},
                                 {filled.name: fill} if fill is not None else {})
    m = rates.apply(base, measured, tolerance=0.0)
    m = dataclasses.replace(m, name=name or f"{base.name}-probed", notes=(),
                            description=f"{h.model or h.llvm_cpu}, measured by tsl probe",
                            params=dataclasses.replace(base.params, cpus=(h.llvm_cpu,)))
    text = dumps(m, _header(m, base, h, measured))
    # What is written must load back as it is.
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d) / f"{m.name}.toml"
        tmp.write_text(text)
        try:
            load(tmp)
        except TAMError as e:  # pragma: no cover - a writer bug, not a user error
            raise AssertionError(f"probe wrote a file that does not load: {e}") from e
    return m, text


def _header(m: Machine, base: Machine, h, measured) -> str:
    clock = measured.clock_hz
    rate = {p.name: measured.rates[signature(p)] for p in base.primitives}
    return "\n".join(
        [f"{m.name}: this host, measured by `python -m tsl.backends.cpu probe` on "
         f"{time.strftime('%Y-%m-%d')}.", "",
         f"Host: {h.model or '?'} ({h.arch}, LLVM cpu {h.llvm_cpu}, family {h.family} model "
         f"{h.model_id}), {h.cores} cores; caches from sysfs: "
         + ", ".join(f"L{c.level} {c.bytes // 1024} KiB" for c in h.caches) + ".",
         f"Derived from {base.name} ({Path(base.source).name}); see that file for its sources "
         f"and what it does not model.",
         f"clock_hz: {clock / 1e9:.3g} GHz, timed with a chain of dependent one-cycle integer "
         f"operations on one core (not a sustained all-core clock).",
         f"Throughput: one core, independent accumulator chains of each primitive's "
         f"instruction, best of {SAMPLES} samples of {SAMPLE_SECONDS * 1e3:g} ms:"]
        + [f"  {n}: {r / 1e9:.2f} GMAC/s per core = {r / clock:.2f} MACs/cycle"
           for n, r in rate.items()]
        + [f"{n} bandwidth: {r / 1e9:.1f} GB/s per core = {r / clock:.2f} bytes/cycle from its "
           f"parent, every core streaming its own buffer at once" for n, r in measured.fills.items()]
        + ["Not modelled: frequency changes under load, memory bandwidth contention, "
           "SMT."])
