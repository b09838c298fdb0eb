"""Experiment: na_triton's forward with every q/k/v tile moved by TMA (in-kernel tensor descriptors)
instead of pointer gathers, the window math unchanged, with a warp-specialised variant. The package's
na_triton carries the TMA tiles (``NAConfig.tma``) where this measured faster; the script keeps the
timing comparison and the warp-specialisation experiment.

    python3 lab/gpu/na_tma.py --check     # CPU: interpreter vs the fp32 reference; sm90 compile:
                                          # registers, spills, and whether the PTX has TMA and wgmma
    python3 lab/gpu/na_tma.py --time [--groups plain]  # GPU: this kernel (and warp-specialised) vs na_triton
                                                       # at benchmarks/na_sol.py's cases

Descriptors: one per program and tensor over its (batch, head, dilation group) sub-grid,
shape [N0, N1, N2, head_dim], strides (d0*s0, d1*s1, d2*s2, 1), block [T0, T1, T2, HEAD_PAD]. A box
past the group's end is zero-filled by the hardware (no clamping): those keys are rejected by the
window test as before, those query rows are not stored. Head dims 80/96 load a 128-wide box whose
pad columns are zero-filled the same way. Needs 16-byte aligned bases and row strides (the layout
``[B, *spatial, heads, head_dim]`` with head_dim a multiple of 8 in bf16/fp16).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from xbackend.kernels import na_triton as K  # noqa: E402
from xbackend.kernels.na_triton_blocks import axis_ok as _axis_ok  # noqa: E402
from xbackend.kernels.na_triton_blocks import win_end as _win_end  # noqa: E402
from xbackend.kernels.na_triton_blocks import win_start as _win_start  # noqa: E402
from xbackend.kernels.na_triton_config import pad3  # noqa: E402


@triton.jit
def _na_tma_kernel(
    Q, K_, V, Out,
    sqb, sqh, sq0, sq1, sq2,
    skb, skh, sk0, sk1, sk2,
    svb, svh, sv0, sv1, sv2,
    sob, soh, so0, so1, so2,
    L0, L1, L2,
    KS0, KS1, KS2,
    DIL0, DIL1, DIL2,
    n_heads,
    qk_scale,
    CAUSAL0: tl.constexpr, CAUSAL1: tl.constexpr, CAUSAL2: tl.constexpr,
    STRIDE0: tl.constexpr, STRIDE1: tl.constexpr, STRIDE2: tl.constexpr,
    TQ0: tl.constexpr, TQ1: tl.constexpr, TQ2: tl.constexpr,
    TK0: tl.constexpr, TK1: tl.constexpr, TK2: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
):  # fmt: skip
    BLOCK_M: tl.constexpr = TQ0 * TQ1 * TQ2
    BLOCK_N: tl.constexpr = TK0 * TK1 * TK2
    pid_t = tl.program_id(0)
    pid_bh = tl.program_id(1)
    pid_g = tl.program_id(2)
    b = pid_bh // n_heads
    h = pid_bh % n_heads
    g2 = pid_g % DIL2
    g1 = (pid_g // DIL2) % DIL1
    g0 = pid_g // (DIL1 * DIL2)
    N0 = (L0 - g0 + DIL0 - 1) // DIL0
    N1 = (L1 - g1 + DIL1 - 1) // DIL1
    N2 = (L2 - g2 + DIL2 - 1) // DIL2
    nt1 = tl.cdiv(N1, TQ1)
    nt2 = tl.cdiv(N2, TQ2)
    # No early return: Triton's warp-specialisation pass needs structured control flow (a `return`
    # here lowers to cf.cond_br, which its task-id propagation asserts on). A program past this
    # dilation group's tiles redoes the group's last tile and stores the same values.
    pid_t = tl.minimum(pid_t, tl.cdiv(N0, TQ0) * nt1 * nt2 - 1)
    t2 = pid_t % nt2
    t1 = (pid_t // nt2) % nt1
    t0 = pid_t // (nt1 * nt2)
    a0 = t0 * TQ0
    a1 = t1 * TQ1
    a2 = t2 * TQ2
    z0 = tl.minimum(a0 + TQ0, N0) - 1
    z1 = tl.minimum(a1 + TQ1, N1) - 1
    z2 = tl.minimum(a2 + TQ2, N2) - 1
    lo0 = _win_start(a0, N0, KS0, STRIDE0, CAUSAL0)
    lo1 = _win_start(a1, N1, KS1, STRIDE1, CAUSAL1)
    lo2 = _win_start(a2, N2, KS2, STRIDE2, CAUSAL2)
    hi0 = _win_end(z0, N0, KS0, STRIDE0, CAUSAL0)
    hi1 = _win_end(z1, N1, KS1, STRIDE1, CAUSAL1)
    hi2 = _win_end(z2, N2, KS2, STRIDE2, CAUSAL2)

    offs_m = tl.arange(0, BLOCK_M)
    m0 = tl.minimum(a0 + offs_m // (TQ1 * TQ2), N0 - 1)
    m1 = tl.minimum(a1 + (offs_m // TQ2) % TQ1, N1 - 1)
    m2 = tl.minimum(a2 + offs_m % TQ2, N2 - 1)
    qs0 = _win_start(m0, N0, KS0, STRIDE0, CAUSAL0)
    qs1 = _win_start(m1, N1, KS1, STRIDE1, CAUSAL1)
    qs2 = _win_start(m2, N2, KS2, STRIDE2, CAUSAL2)
    qe0 = _win_end(m0, N0, KS0, STRIDE0, CAUSAL0)
    qe1 = _win_end(m1, N1, KS1, STRIDE1, CAUSAL1)
    qe2 = _win_end(m2, N2, KS2, STRIDE2, CAUSAL2)

    b64 = b.to(tl.int64)
    h64 = h.to(tl.int64)
    q_desc = tl.make_tensor_descriptor(
        Q + b64 * sqb + h64 * sqh + g0 * sq0 + g1 * sq1 + g2 * sq2, shape=[N0, N1, N2, HEAD_DIM],
        strides=[DIL0 * sq0, DIL1 * sq1, DIL2 * sq2, 1], block_shape=[TQ0, TQ1, TQ2, HEAD_PAD])
    k_desc = tl.make_tensor_descriptor(
        K_ + b64 * skb + h64 * skh + g0 * sk0 + g1 * sk1 + g2 * sk2, shape=[N0, N1, N2, HEAD_DIM],
        strides=[DIL0 * sk0, DIL1 * sk1, DIL2 * sk2, 1], block_shape=[TK0, TK1, TK2, HEAD_PAD])
    v_desc = tl.make_tensor_descriptor(
        V + b64 * svb + h64 * svh + g0 * sv0 + g1 * sv1 + g2 * sv2, shape=[N0, N1, N2, HEAD_DIM],
        strides=[DIL0 * sv0, DIL1 * sv1, DIL2 * sv2, 1], block_shape=[TK0, TK1, TK2, HEAD_PAD])
    o_desc = tl.make_tensor_descriptor(
        Out + b64 * sob + h64 * soh + g0 * so0 + g1 * so1 + g2 * so2, shape=[N0, N1, N2, HEAD_DIM],
        strides=[DIL0 * so0, DIL1 * so1, DIL2 * so2, 1], block_shape=[TQ0, TQ1, TQ2, HEAD_PAD])
    q = tl.reshape(q_desc.load([a0, a1, a2, 0]), [BLOCK_M, HEAD_PAD])

    offs_n = tl.arange(0, BLOCK_N)
    n0 = offs_n // (TK1 * TK2)
    n1 = (offs_n // TK2) % TK1
    n2 = offs_n % TK2
    nb1 = tl.cdiv(hi1 - lo1, TK1)
    nb2 = tl.cdiv(hi2 - lo2, TK2)
    n_blocks = tl.cdiv(hi0 - lo0, TK0) * nb1 * nb2

    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], dtype=tl.float32)
    for j in tl.range(0, n_blocks, warp_specialize=WARP_SPECIALIZE):
        c0 = lo0 + (j // (nb1 * nb2)) * TK0
        c1 = lo1 + ((j // nb2) % nb1) * TK1
        c2 = lo2 + (j % nb2) * TK2
        kb = tl.reshape(k_desc.load([c0, c1, c2, 0]), [BLOCK_N, HEAD_PAD])
        vb = tl.reshape(v_desc.load([c0, c1, c2, 0]), [BLOCK_N, HEAD_PAD])
        qk = tl.dot(q, tl.trans(kb)) * qk_scale
        # Keys past the box (zero-filled past the group's end, or real keys past hi) fail the window test.
        ok = _axis_ok(c0, c0 + n0, qs0, qe0, KS0, TK0, CAUSAL0)
        ok = ok & _axis_ok(c1, c1 + n1, qs1, qe1, KS1, TK1, CAUSAL1)
        ok = ok & _axis_ok(c2, c2 + n2, qs2, qe2, KS2, TK2, CAUSAL2)
        qk = tl.where(ok, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(vb.dtype), vb)
        m_i = m_new

    acc = acc / l_i[:, None]
    # The store box is clipped at the group's end and at head_dim by the hardware.
    o_desc.store([a0, a1, a2, 0], tl.reshape(acc.to(Out.dtype.element_ty), [TQ0, TQ1, TQ2, HEAD_PAD]))


def _alloc(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device="cuda")


def neighborhood_attention(q, k, v, kernel_size, dilation, is_causal, scale=None, stride=None, *, config=None,
                           warp_specialize: bool = False):  # fmt: skip
    """Same contract as na_triton.neighborhood_attention (CUDA, bf16/fp16; the interpreter on CPU)."""
    ks, dil = pad3(tuple(kernel_size), 1), pad3(tuple(dilation), 1)
    causal = pad3(tuple(bool(c) for c in is_causal), False)
    st = pad3(tuple(stride) if stride is not None else (), 1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    q3, k3, v3, o3 = (K._as_3d(t) for t in (q, k, v, out))
    batch, s0, s1, s2, heads, head_dim = q3.shape
    if config is None:
        config = K.config_for(q.shape, kernel_size, dilation, is_causal, stride)
    glen0 = [-(-L // d) for L, d in zip((s0, s1, s2), dil, strict=True)]
    grid = (math.prod(-(-n // t) for n, t in zip(glen0, config.q_tile, strict=True)), batch * heads, math.prod(dil))
    if q.device.type == "cuda":
        triton.set_allocator(_alloc)

    def strides(t: torch.Tensor) -> tuple[int, ...]:
        s = t.stride()
        return (s[0], s[4], s[1], s[2], s[3])

    _na_tma_kernel[grid](
        q3, k3, v3, o3, *strides(q3), *strides(k3), *strides(v3), *strides(o3), s0, s1, s2, *ks, *dil, heads,
        float(scale) * K._LOG2E, *causal, *st, *config.q_tile, *config.kv_tile,
        HEAD_DIM=head_dim, HEAD_PAD=triton.next_power_of_2(head_dim), WARP_SPECIALIZE=warp_specialize,
        num_warps=config.num_warps, num_stages=config.num_stages, enable_fp_fusion=True,
    )  # fmt: skip
    return out


# -- checks ----------------------------------------------------------------------------------------------
CHECK_CASES = [  # spatial, kernel, dilation, causal, stride, (q_tile, kv_tile) or None
    ((40,), (7,), (1,), (False,), (1,), ((1, 1, 16), (1, 1, 16))),
    ((9, 11), (3, 5), (2, 1), (True, False), (1, 1), ((1, 4, 4), (1, 2, 8))),
    ((5, 6, 7), (3, 3, 5), (1, 2, 1), (True, False, False), (1, 1, 1), ((2, 2, 4), (1, 4, 4))),
    ((6, 8, 9), (3, 4, 3), (1, 1, 3), (False, True, False), (3, 4, 2), None),
]


def check_interpreter() -> None:
    from test_na_kernels import _patch_triton_interpreter_index, make_qkv, rel_err  # tests/kernels

    from xbackend.ops.neighborhood_attention import reference

    _patch_triton_interpreter_index()
    for spatial, kernel, dil, causal, stride, tiles in CHECK_CASES:
        config = None if tiles is None else K.NAConfig(tiles[0], tiles[1], 4, 1)
        for head_dim in (16, 24):  # 24: a padded head dim (box 32, zero-filled past 24)
            q, k, v = make_qkv(spatial, 2, head_dim, torch.float32, seed=3, batch=2)
            ref = reference(q.double(), k.double(), v.double(), kernel, dil, causal, None, stride)
            out = neighborhood_attention(q, k, v, kernel, dil, causal, None, stride, config=config)
            err = rel_err(out, ref)
            print(f"interpreter {spatial} k{kernel} d{dil} c{causal} s{stride} head_dim {head_dim}: rel err {err:.2e}")
            assert err < 1e-5


def check_sm90() -> None:
    from xbackend.fleet import _capture, _worker

    for (spatial, heads, dim, kernel), ws in [(c, w) for c in [((40, 96, 96), 4, 64, (11, 11, 11)),
                                                             ((30, 48, 80), 24, 128, (18, 24, 24))]
                                              for w in (False, True)]:  # fmt: skip
        n = len(kernel)

        def make(dtype, device, spatial=spatial, heads=heads, dim=dim):
            return tuple(torch.empty((1, *spatial, heads, dim), dtype=dtype, device=device) for _ in range(3))

        def fn(q, k, v, kernel=kernel, n=n, ws=ws):
            return neighborhood_attention(q, k, v, kernel, (1,) * n, (False,) * n, None, (1,) * n, warp_specialize=ws)

        _, launches = _capture.capture("sm90", "cuda", fn, make, torch.bfloat16)
        r = _worker.compile_triton(launches[0].spec, "sm90", stages=("ptx",))
        if r.error is not None:
            print(f"sm90 {spatial} {heads}x{dim} warp_specialize={ws}: does not compile: {r.error}")
            continue
        ptx = r.extra["ptx"]
        print(f"sm90 {spatial} {heads}x{dim} warp_specialize={ws}: setmaxnreg {ptx.count('setmaxnreg')}, {r.registers} registers, {r.spill_bytes} spill bytes, "
              f"{r.shared_bytes} shared; cp.async.bulk.tensor {ptx.count('cp.async.bulk.tensor')}, "
              f"wgmma.mma_async {ptx.count('wgmma.mma_async')}, ld.shared {ptx.count('ld.shared')}")


# Warp-specialised variants per case name: (label, q_tile, kv_tile, num_warps, num_stages); the
# default config's tiles with warp specialisation are always timed.
WS_VARIANTS = {
    "3-D video": [("ws q2x8x8 w8 s2", (2, 8, 8), (1, 2, 32), 8, 2), ("ws q2x4x8 s2", (2, 4, 8), (1, 2, 32), 4, 2)],
    "DiffVAE stage-5 tile": [("ws q4x4x8 w8 s2", (4, 4, 8), (2, 2, 16), 8, 2), ("ws q4x4x4 s2", (4, 4, 4), (2, 2, 16), 4, 2)],
}


def time_cases(groups: list[str]) -> None:
    from na_sol import CASES, args_of, reference_sample, sample_error
    from triton.testing import do_bench

    for case in [c for g in groups for c in CASES[g]]:
        args = args_of(case, torch.device("cuda"))
        sample = reference_sample(case, args)
        line = case.name
        variants = [("na_triton", K.neighborhood_attention), ("tma", neighborhood_attention),
                    ("tma+ws", lambda *a: neighborhood_attention(*a, warp_specialize=True))]
        for label, qt, kt, nw, ns in WS_VARIANTS.get(case.name, []):
            cfg = K.NAConfig(qt, kt, nw, ns)
            variants.append((label, lambda *a, cfg=cfg: neighborhood_attention(*a, config=cfg, warp_specialize=True)))
        for name, fn in variants:
            try:
                out = fn(*args)
            except Exception as exc:  # a variant that does not compile is a result
                line += f" | {name} failed: {str(exc).splitlines()[0][:80]}"
                continue
            err = sample_error(case, out, sample)
            ms = do_bench(lambda fn=fn, args=args: fn(*args), return_mode="median")
            line += f" | {name} {ms:.3f} ms err {err:.4f}"
        print(line, flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--groups", default="plain,strided,head_dims", help="benchmarks/na_sol.py case groups to time")
    a = ap.parse_args()
    if a.check:
        if os.environ.get("TRITON_INTERPRET") == "1":
            sys.path.insert(0, str(ROOT / "tests" / "kernels"))
            check_interpreter()
        else:
            check_sm90()
    if a.time:
        time_cases(a.groups.split(","))
