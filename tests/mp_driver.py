"""One rank of a multi-process test run (tests/test_multiprocess.py): joins the run from the
DLR_* environment variables, then runs stages through the public CLIs in this one process (one
interpreter start and one `jax.distributed.initialize` per rank instead of one per stage).

    python -m tests.mp_driver WORKDIR STAGE[,STAGE...] [k=v ...]   (config overrides)

STAGE: a `dlr_jax.train` stage, or `evaluate` (the rl stage's model; benchmark synthetic, or BENCH with
`evaluate:BENCH`, read from $DLR_DATA_DIR); `STAGE@N`
reruns a finished stage to N steps (`train.STAGE.num_steps=N`): it restores the checkpoint every
process saved and trains on from there."""

import os
import sys

if __name__ == "__main__":
    import jax

    if os.environ.get("JAX_PLATFORMS") == "cpu":
        jax.config.update("jax_default_matmul_precision", "highest")  # as tests/conftest.py
    from dlr_jax import train
    from dlr_jax.core.sharding import maybe_initialize_distributed
    from dlr_jax.eval import cli as evaluate

    maybe_initialize_distributed()
    workdir, stages, sets = sys.argv[1], sys.argv[2].split(","), sys.argv[3:]
    as_flags = lambda kvs: [a for kv in kvs for a in ("--set", kv)]  # noqa: E731
    carried: list[str] = []  # a `stage@n` step count, in force for the stages after it (as the workdir records it)
    for stage in stages:
        if stage.partition(":")[0] == "evaluate":
            bench = stage.partition(":")[2] or "synthetic"
            evaluate.main(["--workdir", workdir, "--stage", "rl", "--benchmarks", bench, "--no-progress",
                           *as_flags(s for s in sets if s.startswith("eval."))])
        else:
            stage, _, more = stage.partition("@")
            extra = ["run.allow_config_change=true"] if more else []
            if more:
                carried = [c for c in carried if not c.startswith(f"train.{stage}.num_steps=")]
                carried.append(f"train.{stage}.num_steps={more}")
            flags = as_flags([*sets, *carried, *extra])
            code = train.main(["--stage", stage, "--workdir", workdir, "--mode", "cot", *flags])
            if code:
                raise SystemExit(code)
