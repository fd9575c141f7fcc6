"""Which clock and rates a CPU machine has on this host.

In order, each replacing the one before where it knows more:

1. the machine file's published figures (`provenance` "built-in");
2. its micro-architecture's, where the file has a `[params.uarch.NAME]` table whose `vendor`,
   `family` and `models` ranges (inclusive `[first, last]` pairs) match the OS's: the feature
   flags cannot tell Zen 1 from Zen 3, but their vpmaddwd rates differ by half. The table
   gives `macs_per_cycle = {primitive = MACs per cycle}`, optionally `clock_hz`, and its
   `source` (`provenance` "built-in, NAME figures");
3. this host's, measured by `probe` on first use and cached per host in
   `$TSL_CACHE_DIR/host-<hash>.json` (default `~/.cache/tsl`), keyed by the CPU's model, vendor,
   family, features and core count, tsl's installed version and the probe's own source, so a
   change of any measures again: the clock and each primitive's rate replace the figures above
   where they differ by more than `TOLERANCE` (`provenance` "probed"), and so does the rate a
   core's cache fills from the shared cache (`probe.fill_rate`: the `bandwidth` of the level
   `probe.filled_level` names). `TSL_PROBE=0` skips it.

A user's own machine file (a path, not a built-in name) keeps its figures as written.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from ...errors import TAMError, TSLError
from ...tam.loader import BUILTIN_DIR
from ...tam.machine import Machine
from . import probe as probe_mod

ENV_PROBE = "TSL_PROBE"
ENV_CACHE = "TSL_CACHE_DIR"
# Rates within this fraction of the file's are the file's: a probe on a busy 2-core host reads
# up to ~5% low even as the best of five, and a 5% difference changes no schedule.
TOLERANCE = 0.10
UARCH_KEYS = {"vendor", "family", "models", "macs_per_cycle", "clock_hz", "source"}
_MEMO: dict[Path, "Measurement"] = {}


@dataclass(frozen=True)
class Measurement:
    """This host's clock (Hz), MACs per second on one core per primitive `signature`, and
    bytes per second one core's cache level fills from the shared cache, per level name."""

    clock_hz: float
    rates: dict[str, float] = field(default_factory=dict)
    fills: dict[str, float] = field(default_factory=dict)


def cache_dir() -> Path:
    env = os.environ.get(ENV_CACHE)
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tsl"


def host_key(h) -> dict:
    """What the cached measurement holds for: a change of any of it measures again."""
    try:
        version = metadata.version("tsl")
    except metadata.PackageNotFoundError:
        version = "not installed"
    src = hashlib.sha256(Path(probe_mod.__file__).read_bytes()).hexdigest()[:16]
    return {"cpu": h.model, "vendor": h.vendor, "family": h.family, "model": h.model_id,
            "llvm_cpu": h.llvm_cpu, "features": sorted(h.features), "cores": h.cores,
            "tsl": version, "probe_source": src}


def cache_path(h) -> Path:
    digest = hashlib.sha256(json.dumps(host_key(h), sort_keys=True).encode()).hexdigest()
    return cache_dir() / f"host-{digest[:16]}.json"


def _read(path: Path, key: dict) -> Measurement | None:
    try:
        doc = json.loads(path.read_text())
        if doc.get("key") != key:  # a hash collision or a hand-edited file: measure again
            return None
        return Measurement(float(doc["clock_hz"]), {k: float(v) for k, v in doc["rates"].items()},
                           {k: float(v) for k, v in doc["fills"].items()})
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _write(path: Path, key: dict, meas: Measurement, seconds: float) -> None:
    doc = {"key": key, "clock_hz": meas.clock_hz, "rates": meas.rates, "fills": meas.fills,
           "measured": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "probe_seconds": round(seconds, 2)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)  # atomic: a concurrent reader sees the old file or the new one


def measured(m: Machine, h, refresh: bool = False) -> tuple[Measurement, Path]:
    """This host's measurement for m's primitives: the cache's, with whatever it lacks (or all,
    `refresh`) measured now and written back."""
    path, key = cache_path(h), host_key(h)
    have = None if refresh else (_MEMO.get(path) or _read(path, key))
    need = {probe_mod.signature(p): p for p in m.primitives}
    filled = probe_mod.filled_level(m)
    fill_needed = filled is not None and (have is None or filled.name not in have.fills)
    if have is not None and not set(need) - set(have.rates) and not fill_needed:
        _MEMO[path] = have
        return have, path
    t0 = time.perf_counter()
    clock = have.clock_hz if have else probe_mod.clock_hz(m)
    rates = dict(have.rates) if have else {}
    for sig, p in need.items():
        if sig not in rates:
            rates[sig] = probe_mod.primitive_rate(m, p)
    fills = dict(have.fills) if have else {}
    if fill_needed:
        rate = probe_mod.fill_rate(m)
        if rate is not None:
            fills[filled.name] = rate
    meas = Measurement(clock, rates, fills)
    try:
        _write(path, key, meas, time.perf_counter() - t0)
    except OSError:
        pass  # a read-only home: measured again by the next process, still correct
    _MEMO[path] = meas
    return meas, path


def _off(a: float, b: float, tolerance: float) -> bool:
    return abs(a / b - 1) > tolerance if b else True


def apply(m: Machine, meas: Measurement, tolerance: float = TOLERANCE,
          label: str = "probed") -> Machine:
    """`m` with `meas`'s clock and primitive rates where they differ from m's by more than
    `tolerance` (0: wherever they differ), its peaks recomputed from its primitives when
    anything changed; `provenance` is `label` then, else "built-in"; a note says what."""
    clock = meas.clock_hz if _off(meas.clock_hz, m.clock_hz, tolerance) else m.clock_hz
    said = [f"clock {clock / 1e9:.3g} GHz (file {m.clock_hz / 1e9:.3g})"] \
        if clock != m.clock_hz else []
    prims = []
    for p in m.primitives:
        r = meas.rates.get(probe_mod.signature(p), p.macs_per_cycle * m.clock_hz)
        if _off(r, p.macs_per_cycle * m.clock_hz, tolerance):
            said.append(f"{p.name} {r / clock:.3g} MACs/cycle (file {p.macs_per_cycle:g})")
        else:  # the file's rate stands, per second; per cycle it follows the clock
            r = p.macs_per_cycle * m.clock_hz
        prims.append(dataclasses.replace(p, macs_per_cycle=round(r / clock, 2)))
    memory = tuple(_filled(lv, meas, clock, tolerance, said) for lv in m.memory)
    if not said:
        return dataclasses.replace(m, provenance="built-in", notes=m.notes + (
            f"{label}: within {tolerance:.0%} of the file's clock and rates; kept them",))
    cores = m.cores()
    peaks = dict(m.peaks)
    for d in {d for p in prims for d in _dtypes(p)}:
        best = max(p.macs_per_cycle for p in prims if d in _dtypes(p))
        peaks[d] = float(f"{2 * cores * clock * best:.4g}")  # a MAC is two operations
    return dataclasses.replace(m, clock_hz=clock, primitives=tuple(prims), peaks=peaks,
                               memory=memory, provenance=label,
                               notes=m.notes + (f"{label}: " + ", ".join(said),))


def _filled(lv, meas: Measurement, clock: float, tolerance: float, said: list):
    """Level `lv` with the measured fill rate as its bandwidth (bytes per cycle at `clock`)
    where one was measured and is off the file's by more than `tolerance`; `said` gets why."""
    rate = meas.fills.get(lv.name)
    if rate is None or not _off(rate / clock, lv.bandwidth, tolerance):
        return lv
    said.append(f"{lv.name} fill {rate / clock:.3g} bytes/cycle (file {lv.bandwidth:g})")
    return dataclasses.replace(lv, bandwidth=round(rate / clock, 2))


def _dtypes(p) -> set[str]:
    """The peak keys a primitive serves (an unsigned-by-signed int8 dot serves int8 GEMMs)."""
    return {p.a_dtype, "int8" if p.a_dtype == "uint8" else p.a_dtype}


def uarch(m: Machine, h) -> tuple[str, dict] | None:
    """(name, table) of m's `[params.uarch.NAME]` that matches host `h`, if one does."""
    tables = m.params.uarch
    if not isinstance(tables, dict):
        raise TAMError(f"{Path(m.source).name}: [params] key 'uarch': must be a table of "
                       f"tables ([params.uarch.NAME])")
    for name, t in tables.items():
        where = f"{Path(m.source).name}: [params.uarch.{name}]"
        if not isinstance(t, dict) or set(t) - UARCH_KEYS or "macs_per_cycle" not in t:
            raise TAMError(f"{where}: expected keys {sorted(UARCH_KEYS)} (macs_per_cycle "
                           f"required), got {sorted(t) if isinstance(t, dict) else t!r}")
        unknown = set(t["macs_per_cycle"]) - {p.name for p in m.primitives}
        if unknown:
            raise TAMError(f"{where}: key 'macs_per_cycle' names no primitive of {m.name}: "
                           f"{sorted(unknown)}")
        if t.get("vendor", h.vendor) == h.vendor and t.get("family") == h.family and \
                h.model_id is not None and \
                any(lo <= h.model_id <= hi for lo, hi in t.get("models", ())):
            return name, t
    return None


def for_uarch(m: Machine, h) -> Machine:
    """`m` with the figures of the micro-architecture table matching `h`, if any."""
    found = uarch(m, h)
    if found is None:
        return dataclasses.replace(m, provenance="built-in")
    name, t = found
    clock = float(t.get("clock_hz", m.clock_hz))
    meas = Measurement(clock, {probe_mod.signature(p): t["macs_per_cycle"][p.name] * clock
                               for p in m.primitives if p.name in t["macs_per_cycle"]})
    out = apply(m, meas, 0.0, label=f"built-in, {name} figures")
    return dataclasses.replace(out, provenance=f"built-in, {name} figures",
                               notes=out.notes + (f"{name} figures: {t.get('source', '?')}",))


def for_host(m: Machine, h, probe: bool | None = None) -> Machine:
    """`m` (already specialized to h's cores and caches) with this host's figures: a built-in
    file's micro-architecture table, then the probe's measurement (`probe`: None = unless
    TSL_PROBE=0). A user's own file is returned as it is."""
    if Path(m.source).parent != BUILTIN_DIR:
        return m
    m = for_uarch(m, h)
    if probe is None:
        probe = os.environ.get(ENV_PROBE, "1") != "0"
    if not probe:
        return dataclasses.replace(m, notes=m.notes + (f"not probed ({ENV_PROBE}=0)",))
    try:
        meas, path = measured(m, h)
    except TSLError as e:  # the file's figures stand, and the machine says why
        return dataclasses.replace(m, notes=m.notes + (f"probe failed, file figures kept: "
                                                       f"{str(e).splitlines()[0]}",))
    base = m.provenance
    out = apply(m, meas, TOLERANCE, label=f"probed ({path})")
    return dataclasses.replace(out, provenance="probed" if out.provenance.startswith("probed")
                               else base)
