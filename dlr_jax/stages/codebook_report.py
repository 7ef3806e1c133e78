"""The old name of `python -m dlr_jax.stages.codebook.report`, kept so that existing scripts still run."""

import sys

from dlr_jax.stages.codebook.report import main

if __name__ == "__main__":
    sys.exit(main())
