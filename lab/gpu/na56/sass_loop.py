"""Static size of a hand-written sm90a NA kernel's key-block loop, on a CPU with nvcc: compile, disassemble,
and count the SASS instructions of the shortest backward-branch span holding the loop's eight HGMMAs (four
q.k steps, four p.v steps), and of the refill body only the TMA-issuing thread's warp runs.

    python3 lab/gpu/na56/sass_loop.py xbackend/kernels/na_sm90.cu [nvcc flags, e.g. -DNAME=1]

nvdisasm and cuobjdump are Triton's bundled copies, else those on PATH (``nvidia_tool``).
"""

from __future__ import annotations

import collections
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from xbackend.fleet._resources import cubin_resources, nvidia_tool  # noqa: E402


def loop_counts(source: str, macros: list[str]) -> dict[str, object]:
    cubin = Path(tempfile.mkdtemp()) / "k.cubin"
    subprocess.run(["nvcc", "-arch=sm_90a", "-cubin", "-O3", "-std=c++17", f"-I{ROOT / 'xbackend' / 'kernels'}",
                    *macros, "-o", str(cubin), source], check=True)
    (res,) = cubin_resources(cubin.read_bytes(), 0).values()
    sass = subprocess.run([nvidia_tool("nvdisasm"), "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
    labels: dict[str, int] = {}
    instr: list[str] = []
    for line in sass.splitlines():
        if m := re.match(r"\s*(\.L_x_\d+):", line):
            labels[m.group(1)] = len(instr)
        elif m := re.search(r"/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", line):
            instr.append(m.group(1))
    loop = None
    for i, ins in enumerate(instr):
        m = re.search(r"BRA `\((\.L_x_\d+)\)", ins)
        if m and labels.get(m.group(1), i) < i:
            span = (labels[m.group(1)], i + 1)
            if sum("HGMMA" in x for x in instr[span[0]:span[1]]) == 8 and (loop is None or span[1] - span[0] < loop[1] - loop[0]):
                loop = span
    if loop is None:
        raise SystemExit("no loop with eight HGMMAs found")
    body = instr[loop[0]:loop[1]]
    refill = 0
    bar = next((k for k, x in enumerate(body) if "BAR.SYNC" in x), None)
    if bar is not None:
        k = next(k for k in range(bar, len(body)) if "BRA" in body[k])
        target = re.search(r"(\.L_x_\d+)", body[k]).group(1)
        refill = labels[target] - (loop[0] + k) - 1
    ops = collections.Counter(x.split()[1] if x.startswith("@") else x.split()[0] for x in body)
    return {
        "resources": f"{res.registers} registers, {res.spill_bytes} B spill",
        "loop": len(body),
        "refill": refill,
        "top": ops.most_common(8),
    }


def main() -> None:
    source, macros = sys.argv[1], sys.argv[2:]
    c = loop_counts(source, macros)
    print(f"{source} {' '.join(macros)}: {c['resources']}")
    print(f"  loop {c['loop']} SASS instructions a block; the refill body {c['refill']} of them "
          f"(only the issuing thread's warp), {c['loop'] - c['refill']} for the other warps")
    print("  most common:", ", ".join(f"{op} {n}" for op, n in c["top"]))


if __name__ == "__main__":
    main()
