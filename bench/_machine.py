"""What the benchmarks record about the machine they ran on."""

from __future__ import annotations


def cpu_flags() -> list[str]:
    """The CPU flags that matter for matrix products (x86 Linux; empty elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next(line for line in f if line.startswith("flags")).split(":", 1)[1].split()
    except (OSError, StopIteration):
        return []
    return sorted(f for f in flags if f.startswith(("avx", "amx", "fma")))
