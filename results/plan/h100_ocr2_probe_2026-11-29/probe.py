"""Probe: the OCR-2 plan rows on a deviceless H100 with the cuBLAS retry under more XLA options (all failed: "Error loading CUDA libraries"). Runs: output.txt. Commands: python probe.py --configs configs/qwen3-4b-ocr2.yaml --stages sft[,codebook] --devices h100 --set codebook.init_from=results/plan/deepseek-ocr2-config [--set model.attention=xla] --out X --jsonl Y"""
"""The OCR-2 plan rows on H100 with the cuBLAS retry also at autotune level 0 (probe)."""
import sys
import dlr_jax.plan.cli as cli
orig = cli._compile
def patched(lowered, target):
    try:
        return orig(lowered, target)
    except Exception as e:
        if "Error loading CUDA libraries" not in str(e):
            raise
        print("[probe] retry at autotune level 0", flush=True)
        last = e
        for opts in ({"xla_gpu_enable_triton_gemm": False, "xla_gpu_enable_cublaslt": False, "xla_gpu_autotune_level": 0},
                     {"xla_gpu_enable_triton_gemm": False, "xla_gpu_enable_cublaslt": False, "xla_gpu_autotune_level": 0,
                      "xla_gpu_cudnn_gemm_fusion_level": 0, "xla_gpu_enable_command_buffer": ""}):
            try:
                c = lowered.compile(compiler_options=opts)
                print("[probe] OK with", opts, flush=True)
                return c, cli.TRITON_FALLBACK_NOTE.format(where="") + f" ({opts})"
            except Exception as e2:
                print("[probe] FAIL with", opts, str(e2).splitlines()[0][:200], flush=True)
                last = e2
        raise last
cli._compile = patched
from dlr_jax.bench import plan_report
sys.exit(plan_report.main(sys.argv[1:]))
