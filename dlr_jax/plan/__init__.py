"""The deviceless planner: `python -m dlr_jax.plan` (`cli`), its programs, FLOP counter, targets and buffer report."""
