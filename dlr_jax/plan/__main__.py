"""`python -m dlr_jax.plan`: see `dlr_jax.plan.cli`."""

import sys

from dlr_jax.plan.cli import main

sys.exit(main())
