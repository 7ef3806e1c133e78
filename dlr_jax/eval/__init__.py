"""Evaluation: Pass@1 and #L over seeds (`evaluate`), scoring, statistics, aggregation, the interpretability
report (`interpret`) and the latent probe."""
