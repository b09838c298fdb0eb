"""na_triton's inner loop in SASS, without a GPU: capture the launch for a case, compile it for sm90
with the local Triton, disassemble the cubin (Triton's nvdisasm) and count the instructions of the
hottest loop (the longest backward-branch body) by opcode class.

    python3 lab/gpu/na_sass.py [--case video|stage5|2d|small3d] [--q-tile 2,4,8 --kv-tile 1,2,32]
                               [--warps 4 --stages 3] [--no-tma] [--shift [--launch 1]] [--dump FILE]

Static counts per loop trip (one KV block), not a profile: what the issue slots must carry beside the
tensor cores' wgmma. Compare variants by these counts, then time the few that matter on the GPU.
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from xbackend.fleet import _capture  # noqa: E402
from xbackend.fleet._resources import nvidia_tool  # noqa: E402
from xbackend.fleet.native import NativeLaunch  # noqa: E402
from xbackend.kernels import na_triton as K  # noqa: E402

CASES = {
    "video": ((30, 48, 80), 24, 128, (18, 24, 24)),
    "stage5": ((40, 96, 96), 4, 64, (11, 11, 11)),
    "2d": ((128, 128), 16, 128, (13, 13)),
    "small3d": ((16, 64, 112), 12, 128, (9, 15, 15)),
}

CLASSES = [
    ("mma", r"^(HGMMA|HMMA|WARPGROUP|WARPSYNC)"),
    ("mufu", r"^MUFU"),
    ("fp32", r"^(FADD|FMUL|FFMA|FMNMX|FSEL|FSETP|FCHK)"),
    ("int", r"^(IADD3|IMAD|ISETP|LOP3|SHF|LEA|IABS|SEL|PRMT|VIADD|IMNMX|VIMNMX|SGXT|BMSK|FLO|POPC)"),
    ("cvt", r"^(F2FP|F2F|I2F|F2I)"),
    ("pred", r"^(PLOP3|P2R|R2P)"),
    ("move", r"^(MOV|SHFL|S2R|S2UR|R2UR|UMOV|CS2R)"),
    ("uniform", r"^U"),
    ("memory", r"^(LDG|STG|LDS|STS|LDSM|STSM|UTMALDG|UTMASTG|UBLKCP|SYNCS|LDGSTS|LDGDEPBAR|ARRIVES|DEPBAR)"),
    ("barrier", r"^(BAR|MEMBAR|FENCE|ERRBAR|CCTL)"),
    ("control", r"^(BRA|BSSY|BSYNC|EXIT|NOP|YIELD|WARPSYNC|CALL|RET|ELECT)"),
]


def sass_of(case: str, cfg: K.NAConfig, launch_index: int = 0) -> str:
    spatial, heads, dim, kernel = CASES[case]
    n = len(spatial)

    def make(dtype: torch.dtype, device: torch.device) -> tuple:
        shape = (1, *spatial, heads, dim)
        return tuple(torch.empty(shape, dtype=dtype, device=device) for _ in range(3))

    def fn(q, k, v):
        return K.neighborhood_attention(q, k, v, kernel, (1,) * n, (False,) * n, None, config=cfg)

    _, launches = _capture.capture("sm90", "cuda", fn, make, torch.bfloat16)
    import triton

    # The shift launch is preceded by the key-norm pass: attention launches only (0: the first, the
    # shift launch when the config shifts; 1: its online launch for flagged tiles).
    spec = [launch.spec for launch in launches
            if isinstance(launch.spec, NativeLaunch) or "key_norm" not in launch.spec.kernel][launch_index]
    if isinstance(spec, NativeLaunch):
        raise SystemExit(f"attention launch {launch_index} is the CUDA C++ kernel {spec.source.path}: count its "
                         "loop with lab/gpu/na56/sass_loop.py (or set XBACKEND_NA_SM90=0 for na_triton's)")
    kernel_obj = triton.compile(_capture.ast_source(spec), target=_capture.gpu_target("sm90"), options=dict(spec.options))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel_obj.asm["cubin"])
        f.flush()
        return subprocess.run([nvidia_tool("nvdisasm"), "-c", "-hex", f.name], capture_output=True, text=True,
                              check=True).stdout


def hottest_loop(sass: str) -> list[str]:
    """Instructions of the KV loop: the shortest body between a label and a later branch back to it
    that holds both wgmma and exp2 (spin-wait loops on barriers hold neither)."""
    labels = {}
    insts: list[str] = []
    for ln in sass.splitlines():
        if m := re.match(r"^\s*\.(L_x_\d+):", ln):
            labels[m.group(1)] = len(insts)
        elif m := re.match(r"^\s*/\*[0-9a-f]{4,}\*/\s+(.*?);", ln):
            insts.append(m.group(1))
    best: list[str] = []
    for i, text in enumerate(insts):
        m = re.search(r"BRA\s+`?\(?\.(L_x_\d+)", text)
        if m and m.group(1) in labels and labels[m.group(1)] <= i:
            body = insts[labels[m.group(1)]:i + 1]
            if any("HGMMA" in t or "HMMA" in t for t in body) and any("MUFU.EX2" in t for t in body):
                if not best or len(body) < len(best):
                    best = body
    return best


def classify(body: list[str]) -> tuple[collections.Counter, collections.Counter]:
    ops: collections.Counter = collections.Counter()
    classes: collections.Counter = collections.Counter()
    for text in body:
        op = re.sub(r"^@!?U?P\w+\s+", "", text).split()[0]
        base = op.split(".")[0]
        ops[base] += 1
        classes[next((name for name, pat in CLASSES if re.match(pat, base)), "other")] += 1
    return classes, ops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="video", choices=list(CASES))
    ap.add_argument("--q-tile", default=None)
    ap.add_argument("--kv-tile", default=None)
    ap.add_argument("--warps", type=int, default=None)
    ap.add_argument("--stages", type=int, default=None)
    ap.add_argument("--no-tma", action="store_true")
    ap.add_argument("--shift", action="store_true", help="NAConfig.shift (the loop this counts is the first found)")
    ap.add_argument("--pipelined", action="store_true",
                    help="NAConfig.pipelined (with --shift): na_gluon's kernel, whose loop body holds two trips")
    ap.add_argument("--launch", type=int, default=0,
                    help="which attention launch of the call (with --shift, 1 is the online launch for flagged tiles)")
    ap.add_argument("--dump", default=None, help="write the whole SASS here")
    a = ap.parse_args()
    spatial, heads, dim, kernel = CASES[a.case]
    n = len(spatial)
    cfg = K.config_for((1, *spatial, heads, dim), kernel, (1,) * n, (False,) * n)

    def tup(text: str) -> tuple[int, ...]:
        return tuple(int(x) for x in text.split(","))

    cfg = K.NAConfig(tup(a.q_tile) if a.q_tile else cfg.q_tile, tup(a.kv_tile) if a.kv_tile else cfg.kv_tile,
                     a.warps or cfg.num_warps, a.stages or cfg.num_stages, tma=cfg.tma and not a.no_tma,
                     shift=a.shift or a.pipelined, pipelined=a.pipelined)
    sass = sass_of(a.case, cfg, a.launch)
    if a.dump:
        Path(a.dump).write_text(sass)
    body = hottest_loop(sass)
    classes, ops = classify(body)
    print(f"{a.case}: q{cfg.q_tile} kv{cfg.kv_tile} warps {cfg.num_warps} stages {cfg.num_stages} tma {cfg.tma} shift {cfg.shift}")
    print(f"hottest loop: {len(body)} instructions per trip")
    print("  " + "  ".join(f"{k} {v}" for k, v in classes.most_common()))
    print("  " + "  ".join(f"{k} {v}" for k, v in ops.most_common(24)))


if __name__ == "__main__":
    main()
