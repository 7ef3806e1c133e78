"""`python -m dlr_jax.experiments` (see dlr_jax/experiments/__init__.py)."""

from dlr_jax.experiments import main

raise SystemExit(main())
