"""Stage 3, GRPO: the stage (`stage`), one update (`step`), the loss on a batch (`loss`), the GRPO maths
(`grpo`), held-out evaluation (`eval`) and the frozen models the rewards read (`models`)."""
