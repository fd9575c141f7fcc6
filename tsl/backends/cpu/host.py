"""The host CPU: what it can execute, and which built-in CPU machine file fits it best.

`info()` reads the host: LLVM's view of its CPU, checked against the operating system's (so a
virtual machine that hides AVX-512 is believed), the core count from the scheduler's affinity,
cache sizes from sysfs, vendor, family and model from the OS. `choose()` picks the best
built-in CPU machine whose `[params] require` features the host has (`TSL_CPU=<name or path>`
forces one), `specialize()` gives it the host's core count (peaks scaled to it) and cache
capacities. What `target="cpu"` means adds this host's rates to that:
`hostmachine.detect()`, also `tsl.backends.cpu.detect()`.

A CPU machine file says, in `[params]`, `arch` (the `uname -m` it runs on), `require` (LLVM
feature names), optionally `cpus` (LLVM CPU names it was measured on: preferred for them),
`mtriple` (for cross-compiling) and `uarch` (rates per micro-architecture, `rates.py`).

Hardware-cache levels (`managed = false`) map to the host's caches innermost first: the
innermost such level is the L1 data cache, the next the L2, and so on.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from ...errors import BackendUnavailable
from ...tam.loader import builtin_names, load
from ...tam.machine import Machine

# LLVM feature name -> the flag the OS reports for it, where the two differ (Linux /proc/cpuinfo
# on x86 and AArch64). A feature whose flag the OS does not report is not used.
OS_FLAG = {"avx512vnni": "avx512_vnni", "avx512bf16": "avx512_bf16", "avxvnni": "avx_vnni",
           "amx-int8": "amx_int8", "amx-bf16": "amx_bf16", "amx-tile": "amx_tile",
           "sse4.1": "sse4_1", "sse4.2": "sse4_2", "neon": "asimd", "dotprod": "asimddp",
           "fp-armv8": "fp", "fullfp16": "asimdhp"}
ENV = "TSL_CPU"


@dataclass(frozen=True)
class Cache:
    level: int
    bytes: int
    shared_by: int  # logical CPUs sharing one instance


@dataclass(frozen=True)
class HostCPU:
    arch: str  # platform.machine(): "x86_64", "aarch64", "arm64"
    model: str  # the OS's model name
    llvm_cpu: str  # LLVM's name for it ("znver3", "sapphirerapids", "neoverse-v1")
    features: frozenset[str]  # LLVM feature names the host and its OS provide
    cores: int
    caches: tuple[Cache, ...]  # data and unified caches, innermost first
    # What tells micro-architectures of one feature set apart (Zen 3 from Zen 2): the OS's
    # vendor string and CPU family and model numbers, where it reports them.
    vendor: str = ""
    family: int | None = None
    model_id: int | None = None

    def has(self, feature: str) -> bool:
        return feature in self.features

    def cache(self, level: int) -> Cache | None:
        return next((c for c in self.caches if c.level == level), None)


def _arch(name: str) -> str:
    return {"arm64": "aarch64", "amd64": "x86_64", "AMD64": "x86_64"}.get(name, name)


@cache
def _proc_cpuinfo() -> str:
    """/proc/cpuinfo, read once ("" where the OS has none): flags, model, vendor, family."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def _os_flags() -> set[str] | None:
    """CPU flags as the OS reports them (None where it reports none we can read)."""
    m = re.search(r"^(?:flags|Features)\s*:(.*)$", _proc_cpuinfo(), re.M)
    if m:
        return set(m.group(1).split())
    if platform.system() == "Darwin":  # Apple silicon: every one of these has NEON and dotprod
        import subprocess

        out = subprocess.run(["sysctl", "-a"], capture_output=True, text=True).stdout
        flags = {"asimd", "fp"}
        for feat, flag in (("FEAT_DotProd", "asimddp"), ("FEAT_I8MM", "i8mm"),
                           ("FEAT_BF16", "bf16"), ("FEAT_FP16", "asimdhp")):
            if re.search(rf"hw\.optional\.arm\.{feat}: 1", out):
                flags.add(flag)
        return flags
    return None


def _cpuinfo(field: str) -> str | None:
    """The first value of `field` in /proc/cpuinfo (None where there is none)."""
    m = re.search(rf"^{field}\s*:\s*(.*)$", _proc_cpuinfo(), re.M)
    return m.group(1).strip() if m else None


def _number(field: str) -> int | None:
    v = _cpuinfo(field)
    return int(v, 0) if v and re.fullmatch(r"\d+|0x[0-9a-fA-F]+", v) else None


def _caches() -> tuple[Cache, ...]:
    root = Path("/sys/devices/system/cpu/cpu0/cache")
    out = []
    for d in sorted(root.glob("index*")):
        try:
            kind = (d / "type").read_text().strip()
            if kind == "Instruction":
                continue
            size = (d / "size").read_text().strip()
            n = int(re.match(r"\d+", size).group()) * {"K": 1 << 10, "M": 1 << 20}.get(
                size[-1], 1)
            shared = (d / "shared_cpu_list").read_text().strip()
            count = sum(int(b) - int(a) + 1 if "-" in r else 1 for r in shared.split(",")
                        for a, _, b in [r.partition("-")])
            out.append(Cache(int((d / "level").read_text()), n, count))
        except (OSError, AttributeError, ValueError):
            continue
    return tuple(sorted(out, key=lambda c: c.level))


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


@cache
def info() -> HostCPU:
    """The host CPU as LLVM and the OS see it (read once)."""
    import tvm
    from tvm.target import codegen

    cpu = codegen.llvm_get_system_cpu()
    llvm = set(codegen.llvm_get_cpu_features(tvm.target.Target({"kind": "llvm", "mcpu": cpu})))
    flags = _os_flags()
    wanted = {f for m in cpu_machines() for f in m.params.require}
    feats = set(llvm)
    if flags is not None:
        # The OS speaks for the features the machine files ask about: LLVM names the CPU
        # model, and a hypervisor or the OS may switch some of the model's features off.
        for f in wanted:
            (feats.add if OS_FLAG.get(f, f) in flags else feats.discard)(f)
    return HostCPU(_arch(platform.machine()), _cpuinfo("model name") or platform.processor(),
                   cpu, frozenset(feats), _cores(), _caches(), _cpuinfo("vendor_id") or "",
                   _number("cpu family"), _number("model"))


@cache
def cpu_machines() -> tuple[Machine, ...]:
    out = []
    for name in builtin_names():
        m = load(name)
        if m.backend == "cpu":  # this back end's own name: the files it runs
            out.append(m)
    return tuple(out)


def missing(machine: Machine, h: HostCPU | None = None) -> list[str]:
    """What the host lacks to run `machine`: its architecture, or CPU features."""
    h = h or info()
    arch = machine.params.arch
    if arch and _arch(arch) != h.arch:
        return [f"arch {arch} (this host is {h.arch})"]
    return [f for f in machine.params.require if not h.has(f)]


def runnable(h: HostCPU | None = None) -> list[Machine]:
    """Built-in CPU machines this host executes, best first."""
    h = h or info()
    ok = [m for m in cpu_machines() if not missing(m, h)]
    return sorted(ok, key=lambda m: _rank(m, h), reverse=True)


def _rank(m: Machine, h: HostCPU):
    per_core = {d: v / m.cores() for d, v in m.peaks.items()}
    return (h.llvm_cpu in m.params.cpus, per_core.get("float32", 0.0),
            per_core.get("int8", 0.0), len(m.params.require))


def specialize(m: Machine, h: HostCPU) -> Machine:
    """`m` with the host's core count (peaks scaled to it) and cache capacities."""
    core = m.compute_level("core")
    scale = h.cores / core.count if core else 1.0
    compute = tuple(dataclasses.replace(c, count=h.cores) if c is core else c for c in m.compute)
    caches = [lv for lv in m.memory if not lv.managed]
    cap = {lv.name: h.cache(i + 1) for i, lv in enumerate(reversed(caches))}
    memory = []
    for lv in m.memory:
        c = cap.get(lv.name)
        if c is not None:
            # A level kept per core gets its share of a cache that several cores share.
            share = max(1, c.shared_by) if lv.per else 1
            lv = dataclasses.replace(lv, capacity=c.bytes // share)
        memory.append(lv)
    memory = _fit_parents(memory)
    return dataclasses.replace(m, compute=compute, memory=tuple(memory),
                               peaks={d: v * scale for d, v in m.peaks.items()},
                               description=f"{m.description} (this host: {h.cores} cores)")


def _fit_parents(levels):
    """Keep every level no larger than its parent after caches were resized."""
    by = {lv.name: lv for lv in levels}
    out = []
    for lv in levels:
        parent = by.get(lv.parent) if lv.parent else None
        if parent is not None and lv.capacity > parent.capacity:
            lv = dataclasses.replace(lv, capacity=parent.capacity)
        by[lv.name] = lv
        out.append(lv)
    return out


def choose(h: HostCPU) -> tuple[Machine, list[str]]:
    """The built-in machine for `h` (or TSL_CPU's), and why."""
    forced = os.environ.get(ENV)
    if forced:
        m = load(forced)
        lacks = missing(m, h)
        if lacks:
            raise BackendUnavailable(
                f"{ENV}={forced}: this host cannot run machine {m.name}: it lacks {lacks}; "
                f"machines it runs: {[x.name for x in runnable(h)] or 'none built in'}")
        return m, [f"forced by {ENV}={forced}"]
    best = runnable(h)
    if not best:
        raise BackendUnavailable(
            f"no built-in CPU machine runs on this host ({h.arch}, LLVM cpu {h.llvm_cpu}); "
            f"write one (python -m tsl.backends.cpu probe -o my.toml) and pass its path as "
            f"the target")
    m = best[0]
    why = (f"its [params] cpus lists {h.llvm_cpu}" if h.llvm_cpu in m.params.cpus
           else "the highest peak per core")
    notes = [f"host features {sorted(m.params.require)}: all that {m.name} requires",
             f"chosen over {[x.name for x in best[1:]] or 'nothing else runnable'}: {why}"]
    notes += [f"not runnable here: {x.name} (lacks {missing(x, h)})" for x in cpu_machines()
              if missing(x, h)]
    return m, notes
