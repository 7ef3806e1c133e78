"""Training: the one Trainer and the optimizer."""
