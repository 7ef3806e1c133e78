"""`python -m dlr_jax.evaluate`: Pass@1 and #L over seeds (the code is `dlr_jax.eval.evaluate`)."""

from dlr_jax.eval.cli import cli

if __name__ == "__main__":
    cli()
