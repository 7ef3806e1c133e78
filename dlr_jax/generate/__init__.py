"""Generation: the jitted sampler (prefill + while_loop decode), decoding maths, the RL sampling copy and the
latent grammar (constrained decoding)."""
