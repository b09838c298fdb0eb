#!/bin/bash
# One device call: install the wheels in .whl/ and the project, then the named steps, each teed to $OUT/<step>.txt.
#   bash lab/gpu/run_session.sh STEP [STEP ...]
source "$(dirname "$0")/../../benchmarks/_setup.sh"  # every wheel in .whl/ (diffusers too) and the project
export XBACKEND_FAST_KEY=0
step() { local name=$1 limit=$2; shift 2; echo "=== $name ($(date +%T))"; timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.txt" | tail -60; }
for s in "$@"; do
  case $s in
    qk3d) step qk3d_sweep 120 python3 lab/gpu/qk3d_sweep.py ;;
    narrow64) step rmsnorm_narrow_d64 200 python3 lab/gpu/rmsnorm_narrow.py --d 64 --kinds rmsnorm-diffusers,modulate-diffusers --budget-s 150 --out "$OUT" ;;
    strided) step gpu_tests_strided 200 python3 -m pytest -q -p no:cacheprovider -n 8 tests/kernels/test_na_kernels.py -k "strided or gpu" ;;
    nasol) step na_sol 300 python3 benchmarks/na_sol.py --cases plain,strided,head_dims --out "$OUT/na_sol.json" ;;
    tilemodel) step na_tile_model 300 python3 lab/gpu/na_tile_model.py --time --top 3 ;;
    tma) step na_tma 200 python3 lab/gpu/na_tma.py --time ;;
    ws) step na_ws 450 python3 lab/gpu/na_tma.py --time --groups plain ;;
    natests) step gpu_tests_na 300 python3 -m pytest -q -p no:cacheprovider -n 8 -m gpu tests/kernels/test_na_kernels.py tests/test_neighborhood_attention.py ;;
    nasol_tma) step na_sol_tma 250 python3 benchmarks/na_sol.py --cases plain,strided --out "$OUT/na_sol_tma.json" ;;
    ncu) step qk3d_ncu 320 bash lab/gpu/qk3d_ncu.sh ;;
    kerneltests) step gpu_tests_kernels 300 python3 -m pytest -q -p no:cacheprovider -n 8 tests/kernels/test_triton_rmsnorm.py tests/kernels/test_triton_qk_norm_rope.py tests/kernels/test_triton_qk_norm_rope_3d.py tests/test_rmsnorm.py tests/test_rmsnorm_modulate.py tests/test_qk_norm_rope.py tests/test_qk_norm_rope_3d.py ;;
    narrowbench) step bench_narrow 300 xbackend bench qk_norm_rope_3d rmsnorm rmsnorm_modulate --quick --json "$OUT/bench_narrow.json" ;;
    pointbench) step bench_pointwise 300 xbackend bench rmsnorm rmsnorm_modulate gated_residual rotary_embedding qk_norm_rope --quick --json "$OUT/bench_pointwise.json" ;;
    qkbench) step bench_qk3d 200 xbackend bench qk_norm_rope_3d --json "$OUT/bench_qk3d.json" ;;
    addtests) step gpu_tests_add_rmsnorm 240 python3 -m pytest -q -p no:cacheprovider -n 8 tests/kernels/test_triton_add_rmsnorm.py tests/test_add_rmsnorm.py tests/test_gpu_integration.py ;;
    addbench) step bench_add_rmsnorm 200 xbackend bench add_rmsnorm rmsnorm_modulate --json "$OUT/bench_add_rmsnorm.json" ;;
    decode) step diffvae_decode 300 python3 benchmarks/diffvae_decode.py --height 1088 --width 1920 --frames 121 --out "$OUT/diffvae_decode" ;;
    sweep) step na_sweep 330 python3 lab/gpu/na_sweep.py --cases video,stage5 ;;
    sweepv) step na_sweep_video 150 python3 lab/gpu/na_sweep.py --cases video ;;
    sweep2) step na_sweep_2 330 python3 lab/gpu/na_sweep.py --cases 2d,small3d ;;
    tmashapes) step na_tma_shapes 200 python3 lab/gpu/na_tma_shapes.py ;;
    sweep3) step na_sweep_3 200 python3 lab/gpu/na_sweep.py --cases video,stage5 --only "shipped,tma flipped" ;;
    sweep4) step na_sweep_4 200 python3 lab/gpu/na_sweep.py --cases 2d,small3d --only "shipped,tma flipped" ;;
    sweephd) step na_sweep_hd 200 python3 lab/gpu/na_sweep.py --cases hd32,hd64,hd128,stage5 --only "shipped,tma flipped" ;;
    sweepshift) step na_sweep_shift 200 python3 lab/gpu/na_sweep.py --cases video,stage5,small3d,2d,hd64 --only "shipped,shift flipped" ;;
    gluon) step gluon_tests 200 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_na_kernels.py -m gpu -k "gluon or shift" ;
           step na_sweep_gluon 300 python3 lab/gpu/na_sweep.py --cases video,stage5,small3d,hd128 --only "shipped,pipelined flipped,pipelined q 128,pipelined q regs" ;;
    gsweep) step na_sweep_gluon 300 python3 lab/gpu/na_sweep.py --cases video,stage5,small3d,hd128 --only "shipped,pipelined flipped,pipelined q 128,pipelined q regs" ;;
    gws) step gpu_tests_ws 240 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_na_kernels.py -m gpu -k "warp_specialized or pipelined_shift" ;
        step na_sweep_ws 300 python3 lab/gpu/na_sweep.py --cases video,small3d,hd128,stage5 --only "shipped,pipelined q 128,ws q 128,ws q 128 q smem" ;;
    knorm) step gpu_tests_knorm 60 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_key_norm.py ;
        step key_norm_bench 60 python3 lab/gpu/key_norm_bench.py ;;
    gsweepv) step na_sweep_gluon_q128 120 python3 lab/gpu/na_sweep.py --cases video,stage5 --only "shipped,pipelined flipped,pipelined q 128" ;;
    nasolps) step na_sol 240 python3 benchmarks/na_sol.py --cases plain,strided --out "$OUT/na_sol.json" ;;
    nancu) step na_ncu 150 bash lab/gpu/na_ncu.sh video ;;
    nancug) KERNEL=na_fwd_shift step na_ncu_gluon 200 bash lab/gpu/na_ncu.sh video ;;
    nancuws) KERNEL=na_fwd_ws ONLY="ws q 128" step na_ncu_ws 200 bash lab/gpu/na_ncu.sh video ;;
    decode2) step diffvae_2gpu 420 torchrun --nproc_per_node=2 examples/ltx2_diffvae.py --height 1088 --width 1920 --frames 121 --no-stock --phases ;;
    shifttests) step gpu_tests_shift 240 python3 -m pytest -q -p no:cacheprovider -n 4 -m gpu tests/kernels/test_na_kernels.py -k "gluon or shift_and_redo" ;;
    parts) step na_launch_parts 120 python3 lab/gpu/na_launch_parts.py ;;
    gaps) step na_call_gaps 150 python3 lab/gpu/na_call_gaps.py --cases stage5,small3d,2d ;
          step na_call_gaps_triton_launch 150 python3 lab/gpu/na_call_gaps.py --cases stage5,small3d,2d --triton-launch ;;
    timing) step na_timing 150 python3 lab/gpu/na_timing.py ;;
    desc) for i in 1 2; do step na_sweep_launch_forms_$i 150 python3 lab/gpu/na_sweep.py --cases stage5,video --only "shipped,in-kernel descriptors,redo 1 tile,in-kernel + redo 1,stages 2"; done ;;
    partsets) i=0; for sw in "" REDO_CHUNK_MAX=1 HOST_DESCRIPTORS=0 "" ; do i=$((i+1))
                step "na_launch_parts_$i" 120 python3 lab/gpu/na_launch_parts.py --cases stage5,small3d --set "$sw"; done ;;
    flagged) step na_launch_parts_typical 200 python3 lab/gpu/na_launch_parts.py --cases stage5,small3d,video ;
             step na_launch_parts_flagged 200 python3 lab/gpu/na_launch_parts.py --cases stage5,small3d,video --key-scale 8 ;
             step na_launch_parts_flagged_online 200 python3 lab/gpu/na_launch_parts.py --cases stage5,small3d,video --key-scale 8 --online ;
             step na_launch_parts_flagged_redo1 120 python3 lab/gpu/na_launch_parts.py --cases stage5,small3d --key-scale 8 --set REDO_CHUNK_MAX=1 ;;
    flaggedmin) python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_na_kernels.py -k launch_forms 2>&1 | tee "$OUT/gpu_tests_launch_forms.txt" | tail -3
             for m in 2048 4096 8192; do
               step "na_launch_parts_typical_min$m" 120 python3 lab/gpu/na_launch_parts.py --cases stage5 --set REDO_MIN_PROGRAMS=$m
               step "na_launch_parts_flagged_min$m" 200 python3 lab/gpu/na_launch_parts.py --cases stage5,small3d,video --key-scale 8 --set REDO_MIN_PROGRAMS=$m; done ;;
    flaggedfinal) step na_flagged_final_typical 120 python3 lab/gpu/na_launch_parts.py --cases stage5,small3d
                  step na_flagged_final 200 python3 lab/gpu/na_launch_parts.py --cases stage5,small3d,video --key-scale 8 ;;
    suite) step gpu_tests 300 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests plugins ;;
    *) echo "unknown step $s" ;;
  esac
done
