"""`python -m dlr_jax.convert` (the CLI is `dlr_jax.convert.cli.main`)."""

from dlr_jax.convert.cli import main

main()
