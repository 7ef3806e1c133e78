"""Rotary embedding (models/rope.py): inverse frequencies against transformers' own RoPE init for every
scaling we accept, and a clear error for the ones we do not."""

import numpy as np
import pytest

from dlr_jax.config import ModelConfig
from dlr_jax.models.rope import rope_inv_freq

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 1024}


@pytest.mark.parametrize("scaling", [None, LLAMA3, {"rope_type": "linear", "factor": 4.0}])
def test_inverse_frequencies_match_transformers(scaling):
    import transformers as tf
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    theta = 500000.0
    hf_cfg = tf.LlamaConfig(hidden_size=128, num_attention_heads=2, head_dim=64, max_position_embeddings=4096,
                            rope_parameters={"rope_type": "default", "rope_theta": theta, **(scaling or {})})
    kind = (scaling or {}).get("rope_type", "default")
    if kind == "default":  # HF computes the unscaled frequencies inline; written out here
        want = 1.0 / theta ** (np.arange(0, 64, 2, dtype=np.float32) / 64)
    else:
        want = ROPE_INIT_FUNCTIONS[kind](hf_cfg, "cpu")[0].numpy()
    cfg = ModelConfig(vocab_size=16, hidden_size=128, intermediate_size=64, num_layers=1, num_heads=2,
                      num_kv_heads=2, head_dim=64, rope_theta=theta, rope_scaling=scaling)
    got = np.asarray(rope_inv_freq(cfg))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
    if kind == "llama3":  # the scaling does something: the lowest frequencies are divided by the factor
        assert got[-1] == pytest.approx(want[-1]) and got[-1] < (1.0 / theta ** (62 / 64)) / 7.9


def test_an_unsupported_rope_scaling_is_refused_by_name():
    cfg = ModelConfig(vocab_size=16, hidden_size=64, intermediate_size=64, num_layers=1, num_heads=2,
                      num_kv_heads=2, head_dim=32, rope_scaling={"rope_type": "yarn", "factor": 2.0})
    with pytest.raises(ValueError, match="yarn.*default, llama3, linear"):
        rope_inv_freq(cfg)
