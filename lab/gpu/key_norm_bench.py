"""The shift's key-norm reduction on benchmarks/na_sol.py's key shapes: torch's two-kernel expression
(``vector_norm(k, dim=-1, dtype=float32).amax(spatial)``) against key_norm.max_key_norm's one pass, and
``copy_`` of the same keys for the memory roofline.

    python3 lab/gpu/key_norm_bench.py

Per shape: median µs (do_bench), the keys' bytes read over the time in TB/s, and copy_'s rate
(read + write bytes over its time).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from xbackend.kernels import key_norm
from xbackend.kernels.key_norm import max_key_norm

SHAPES = {
    "3-D video (30,48,80) x 24 x 128": (1, 30, 48, 80, 24, 128),
    "DiffVAE stage-5 tile (40,96,96) x 4 x 64": (1, 40, 96, 96, 4, 64),
    "DiffVAE stage-4 tile (20,48,48) x 4 x 128": (1, 20, 48, 48, 4, 128),
    "3-D small window (16,64,112) x 12 x 128": (1, 16, 64, 112, 12, 128),
}


def main() -> None:
    from triton.testing import do_bench

    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__}")
    print(f"{'keys':<44} {'MB':>7} {'torch µs':>9} {'TB/s':>6} {'kernel µs':>10} {'TB/s':>6} {'copy_ µs':>9} "
          f"{'TB/s':>6}  speedup  max rel diff")
    for name, shape in SHAPES.items():
        k = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        dst = torch.empty_like(k)
        nbytes = k.numel() * k.element_size()

        def torch_expr(k=k):
            return torch.linalg.vector_norm(k, dim=-1, dtype=torch.float32).amax(dim=(1, 2, 3)).reshape(-1)

        diff = ((max_key_norm(k) - torch_expr()).abs() / torch_expr()).max().item()
        t_torch = do_bench(torch_expr, return_mode="median") * 1e3
        t_kernel = do_bench(lambda k=k: max_key_norm(k), return_mode="median") * 1e3
        t_copy = do_bench(lambda k=k, dst=dst: dst.copy_(k), return_mode="median") * 1e3
        print(f"{name:<44} {nbytes / 1e6:7.1f} {t_torch:9.1f} {nbytes / t_torch / 1e6:6.2f} {t_kernel:10.1f} "
              f"{nbytes / t_kernel / 1e6:6.2f} {t_copy:9.1f} {2 * nbytes / t_copy / 1e6:6.2f}  "
              f"{t_torch / t_kernel:6.1f}x  {diff:.1e}", flush=True)
        shipped = key_norm.BLOCK_T
        for block in (32, 128, 256):
            key_norm.BLOCK_T = block
            t = do_bench(lambda k=k: max_key_norm(k), return_mode="median") * 1e3
            print(f"  BLOCK_T {block:<4} {t:8.1f} µs  {nbytes / t / 1e6:6.2f} TB/s", flush=True)
        key_norm.BLOCK_T = shipped


if __name__ == "__main__":
    main()
