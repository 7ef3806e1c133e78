"""optimizer.py: per-group global-norm clipping against optax's own clip, one group at a time. The
trainer's use of it (clip_group) is tested in tests/training/test_trainer.py."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import optax

from dlr_jax.training.optimizer import clip_by_group_global_norm


def test_clip_by_group_global_norm_matches_optax_per_group():
    g = {"lm": {"w": jnp.array([0.3, 0.4])}, "ocr": {"w": jnp.array([3.0, 4.0]), "b": jnp.array([12.0])}}
    tx = clip_by_group_global_norm(1.0, lambda path: path[0])
    out, _ = tx.update(g, tx.init(g))
    np.testing.assert_allclose(out["lm"]["w"], [0.3, 0.4])  # norm 0.5 < 1: untouched
    for part in ("lm", "ocr"):  # the peer: optax's own clip, one group at a time
        ref, _ = optax.clip_by_global_norm(1.0).update(g[part], optax.EmptyState())
        for k in g[part]:
            np.testing.assert_allclose(out[part][k], ref[k], rtol=1e-6)
    whole, _ = optax.clip_by_global_norm(1.0).update(g, optax.EmptyState())
    assert not np.allclose(whole["lm"]["w"], g["lm"]["w"])  # the control: one global norm shrinks lm too
