"""The optimizer every stage trains with: global-norm clipping (per parameter group where two models
share one state), then AdamW (or SGD) on a warmup + cosine schedule, and the shardings of its state."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from dlr_jax.config import TrainConfig


def key_name(k: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def clip_by_group_global_norm(max_norm: float, group_of: Callable[[tuple[str, ...]], str]
                              ) -> optax.GradientTransformation:
    """`optax.clip_by_global_norm` applied to each group of parameters on its own: `group_of(path)`
    names the group of a leaf from its tree path. Two models trained in one state (e.g. the latent
    LM and sft's dual-branch OCR decoder) then cannot shrink each other's steps. Same (empty) state as
    `clip_by_global_norm`, so checkpoints do not change."""

    def update_fn(updates, state, params=None):
        del params
        flat, treedef = jax.tree_util.tree_flatten_with_path(updates)
        groups = [group_of(tuple(key_name(k) for k in path)) for path, _ in flat]
        scale = {}
        for g in set(groups):
            norm = optax.global_norm([leaf for (_, leaf), h in zip(flat, groups, strict=True) if h == g])
            scale[g] = jnp.where(norm < max_norm, 1.0, max_norm / norm)
        leaves = [(leaf * scale[g]).astype(leaf.dtype) for (_, leaf), g in zip(flat, groups, strict=True)]
        return jax.tree_util.tree_unflatten(treedef, leaves), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


def make_optimizer(
    cfg: TrainConfig, num_steps: int | None = None, clip_group: Callable[[tuple[str, ...]], str] | None = None
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """AdamW (or SGD) with warmup + cosine after global-norm clipping at cfg.grad_clip; with
    `clip_group`, the clipping is per group of parameters (`clip_by_group_global_norm`)."""
    steps = max(1, num_steps or cfg.num_steps)
    warmup = int(round(cfg.warmup_ratio * steps))
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=cfg.learning_rate,
        warmup_steps=warmup,
        decay_steps=max(steps, warmup + 1),
        end_value=cfg.learning_rate * cfg.min_lr_ratio,
    )

    # No decay on vectors (norm scales, biases): decaying them toward 0 only hurts.
    def decay_mask(params):
        return jax.tree.map(lambda x: x.ndim >= 2, params)

    if cfg.optimizer == "adamw":
        opt = optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay, mask=decay_mask)
    elif cfg.optimizer == "sgd":
        opt = optax.sgd(schedule)
    else:
        raise ValueError(f"optimizer must be adamw or sgd, got {cfg.optimizer!r}")
    if cfg.grad_clip <= 0:
        clip = optax.identity()
    elif clip_group is not None:
        clip = clip_by_group_global_norm(cfg.grad_clip, clip_group)
    else:
        clip = optax.clip_by_global_norm(cfg.grad_clip)
    return optax.chain(clip, opt), schedule


def opt_state_shardings(tx: optax.GradientTransformation, params: Any, mesh: Mesh) -> Any:
    """The sharding of every leaf of `tx.init(params)`: a subtree shaped like `params` (AdamW's mu
    and nu, any per-parameter state) takes the parameters' shardings leaf by leaf; everything else
    (step counts, scalars) is replicated. Without this, a jitted `tx.init` leaves the moments
    replicated on every device (2x the fp32 parameters per device: 64 GB for an 8B model)."""
    abstract = jax.eval_shape(tx.init, params)
    p_treedef = jax.tree.structure(params)
    p_shardings = jax.tree.map(lambda x: x.sharding, params)
    replicated = NamedSharding(mesh, PartitionSpec())

    def is_param_like(x: Any) -> bool:
        try:
            return jax.tree.structure(x) == p_treedef
        except Exception:  # noqa: BLE001 - some optax nodes do not flatten on their own
            return False

    def sharding_of(sub: Any) -> Any:
        if is_param_like(sub):
            same = all(
                a.shape == b.shape
                for a, b in zip(jax.tree.leaves(sub), jax.tree.leaves(params), strict=True)
            )
            if same:
                return p_shardings
        return jax.tree.map(lambda _: replicated, sub)

    return jax.tree.map(sharding_of, abstract, is_leaf=is_param_like)
