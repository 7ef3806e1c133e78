"""`python -m dlr_jax.interpret`: the interpretability report (the code is `dlr_jax.eval.interpret`)."""

import sys

from dlr_jax.eval.interpret import main

if __name__ == "__main__":
    sys.exit(main())
