"""`python -m dlr_jax.bench` (the CLI is `dlr_jax.bench.cli.main`)."""

from dlr_jax.bench.cli import main

main()
