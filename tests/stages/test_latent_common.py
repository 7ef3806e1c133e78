"""The LM's starting codebook (`latent.codebook_init`): what each choice hands `LatentLM`."""

import numpy as np
import pytest

from dlr_jax.config import ConfigError, load_config
from dlr_jax.stages.latent_common import initial_codebook


def _codebook() -> np.ndarray:
    rng = np.random.default_rng(0)
    c = rng.normal(size=(12, 5)) * np.array([100.0, 0.5, 3.0, 7.0, 1.0]) + 40.0  # far from N(0, 1), like a VQ's
    c[:, 4] = 2.5  # a dimension every code shares
    return c.astype(np.float32)


def test_stage_is_the_codebook_as_it_is_and_random_is_none():
    c = _codebook()
    assert initial_codebook(c, "stage") is c
    assert initial_codebook(c, "random") is None
    assert initial_codebook(None, "standardized") is None


def test_standardized_is_a_per_dimension_z_score_that_keeps_the_nearest_code():
    c = _codebook()
    z = initial_codebook(c, "standardized")
    assert z.shape == c.shape and z.dtype == np.float32
    np.testing.assert_allclose(z[:, :4].mean(0), 0.0, atol=1e-5)
    np.testing.assert_allclose(z[:, :4].std(0), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(z[:, 4], 0.0)  # a constant dimension: 0, not NaN
    # written out: (c - mean) / std on the first column
    col = c[:, 0].astype(np.float64)
    np.testing.assert_allclose(z[:, 0], (col - col.mean()) / col.std(), rtol=1e-5)
    # the same affine map on each dimension: a code's order along each dimension is kept
    for d in range(4):
        np.testing.assert_array_equal(np.argsort(z[:, d]), np.argsort(c[:, d]))
    with pytest.raises(ValueError, match="codebook_init"):
        initial_codebook(c, "whitened")


def test_config_key_default_is_the_papers_and_bad_values_are_refused():
    assert load_config("configs/paper/gsm8k.yaml").latent.codebook_init == "stage"
    assert load_config("configs/tiny.yaml").latent.codebook_init == "stage"
    with pytest.raises(ConfigError, match="codebook_init"):
        load_config("configs/tiny.yaml", ["latent.codebook_init=whitened"])
