"""DeepSeek MoE MLP (DeepSeek-V2 / DeepSeek-OCR-2 text decoder): router, dropless routed experts,
shared experts, optional load-balancing loss.

    scores  = softmax(x W_r^T) in fp32                                 [T, E]
    greedy: top-k of scores; group_limited_greedy: keep the `topk_group` groups (of n_group) with
            the highest max score, zero the rest, then top-k          -> weights w [T, k], ids [T, k]
    w      *= routed_scaling_factor (after w /= sum(w) when norm_topk_prob)
    y       = sum_j w_j * Expert_{ids_j}(x) + SharedMLP(x)

as `transformers`' `DeepseekOcr2TextMoe` / `DeepseekV2Moe` compute it (parity: tests/models/
test_moe.py). transformers ignores `norm_topk_prob` for these models; we honour it when set, and the
OCR-2 config leaves it unset, so both agree on the real checkpoint.

Dropless routing: the T*k (token, slot) pairs are sorted by expert id, the tokens gathered in that
order, and every expert matmul is one `jax.lax.ragged_dot` over the contiguous groups (group sizes =
tokens per expert). Nothing computes all experts for all tokens on GPU/TPU, where ragged_dot lowers
to XLA's ragged-dot instruction. (On CPU, jax expands ragged_dot into a masked dense einsum: correct,
and only used by tests; the lowering for GPU is checked in the tests.) Outputs are weighted and
scatter-added back to their token.

Expert weights carry the `expert` logical axis (sharding.RULES maps it to a mesh axis, so experts
are split across devices); the router and the shared experts are ordinary dense weights.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Float, Int

from dlr_jax.config import ConfigError
from dlr_jax.core.sharding import constrain
from dlr_jax.models.transformer import new_param


@dataclasses.dataclass(frozen=True)
class MoeConfig:
    hidden_size: int
    moe_intermediate_size: int
    num_experts: int
    num_experts_per_tok: int
    n_shared_experts: int = 0
    routed_scaling_factor: float = 1.0
    topk_method: str = "greedy"  # greedy | group_limited_greedy
    n_group: int | None = None
    topk_group: int | None = None
    norm_topk_prob: bool = False
    dtype: str = "float32"
    param_dtype: str = "float32"

    def __post_init__(self) -> None:
        if not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ConfigError(f"num_experts_per_tok={self.num_experts_per_tok} must be in 1..{self.num_experts}")
        if self.topk_method not in ("greedy", "group_limited_greedy"):
            raise ConfigError(f"topk_method {self.topk_method!r}: expected greedy | group_limited_greedy")
        if self.topk_method == "group_limited_greedy":
            g, tg = self.n_group, self.topk_group
            if not g or not tg or self.num_experts % g or not 1 <= tg <= g:
                raise ConfigError(f"group_limited_greedy needs n_group | num_experts and 1 <= topk_group <= "
                                  f"n_group; got n_group={g}, topk_group={tg}, num_experts={self.num_experts}")
            if tg * (self.num_experts // g) < self.num_experts_per_tok:
                raise ConfigError("topk_group groups hold fewer experts than num_experts_per_tok")

    @property
    def shared_intermediate_size(self) -> int:
        return self.moe_intermediate_size * self.n_shared_experts


# Stacked over a leading `layers` dim (one entry per sparse layer) by the decoder.
MOE_PARAM_AXES: dict[str, tuple[str | None, ...]] = {
    "router": ("layers", "embed", None),  # [d, E], fp32
    "expert_gate": ("layers", "expert", "embed", "moe_mlp"),
    "expert_up": ("layers", "expert", "embed", "moe_mlp"),
    "expert_down": ("layers", "expert", "moe_mlp", "embed"),
    "shared_gate": ("layers", "embed", "mlp"),
    "shared_up": ("layers", "embed", "mlp"),
    "shared_down": ("layers", "mlp", "embed"),
}


def moe_param_shapes(cfg: MoeConfig, n_layers: int) -> dict[str, tuple[int, ...]]:
    L, d, f, e, fs = n_layers, cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts, cfg.shared_intermediate_size
    shapes = {
        "router": (L, d, e),
        "expert_gate": (L, e, d, f), "expert_up": (L, e, d, f), "expert_down": (L, e, f, d),
    }
    if fs:
        shapes |= {"shared_gate": (L, d, fs), "shared_up": (L, d, fs), "shared_down": (L, fs, d)}
    return shapes


class MoeLayers(nnx.Module):
    """MoE weights of `n_layers` sparse layers, each stacked on a leading `layers` dim."""

    def __init__(self, cfg: MoeConfig, n_layers: int, *, rngs: nnx.Rngs):
        self.cfg = cfg
        shapes = moe_param_shapes(cfg, n_layers)
        self.names = tuple(shapes)
        for name, shape in shapes.items():
            dt = jnp.float32 if name == "router" else jnp.dtype(cfg.param_dtype)  # router stays fp32
            setattr(self, name, new_param(rngs, shape, MOE_PARAM_AXES[name], dt))

    def arrays(self) -> dict[str, jax.Array]:
        return {n: getattr(self, n)[...] for n in self.names}


# ----------------------------------------------------------------------------------------------
# Pure functions over one layer's arrays (no `layers` dim).


def route(
    cfg: MoeConfig, router: Float[Array, "d e"], x: Float[Array, "t d"]
) -> tuple[Float[Array, "t k"], Int[Array, "t k"], Float[Array, "t e"]]:
    """(top-k weights, top-k expert ids, router logits), all routing maths in fp32."""
    logits = jnp.einsum("td,de->te", x.astype(jnp.float32), router.astype(jnp.float32),
                        precision=jax.lax.Precision.HIGHEST)
    scores = jax.nn.softmax(logits, axis=-1)
    if cfg.topk_method == "group_limited_greedy":
        t, e, g = scores.shape[0], cfg.num_experts, cfg.n_group
        group_scores = scores.reshape(t, g, e // g).max(axis=-1)
        _, top_groups = jax.lax.top_k(group_scores, cfg.topk_group)
        keep = jnp.zeros((t, g), bool).at[jnp.arange(t)[:, None], top_groups].set(True)
        scores = jnp.where(jnp.repeat(keep, e // g, axis=1), scores, 0.0)
    weights, ids = jax.lax.top_k(scores, cfg.num_experts_per_tok)
    if cfg.norm_topk_prob and cfg.num_experts_per_tok > 1:
        weights = weights / (jnp.sum(weights, axis=-1, keepdims=True) + 1e-20)
    return weights * cfg.routed_scaling_factor, ids, logits


def grouped_swiglu(
    xs: Float[Array, "n d"], gate: Float[Array, "e d f"], up: Float[Array, "e d f"],
    down: Float[Array, "e f d"], group_sizes: Int[Array, " e"],
) -> Float[Array, "n d"]:
    """Expert SwiGLU over rows sorted by expert (group j = the next group_sizes[j] rows)."""
    dt = xs.dtype
    g = jax.lax.ragged_dot(xs, gate.astype(dt), group_sizes)
    u = jax.lax.ragged_dot(xs, up.astype(dt), group_sizes)
    return jax.lax.ragged_dot(jax.nn.silu(g) * u, down.astype(dt), group_sizes)


def routed_experts(
    cfg: MoeConfig, p: dict[str, jax.Array], x: Float[Array, "t d"], weights: Float[Array, "t k"],
    ids: Int[Array, "t k"],
) -> Float[Array, "t d"]:
    """Dropless dispatch: sort (token, slot) pairs by expert, grouped matmuls, weighted scatter-add."""
    t, k = ids.shape
    flat = ids.reshape(-1)
    order = jnp.argsort(flat, stable=True)  # pair order grouped by expert
    token = order // k
    group_sizes = jnp.bincount(flat, length=cfg.num_experts).astype(jnp.int32)
    out = grouped_swiglu(x[token], p["expert_gate"], p["expert_up"], p["expert_down"], group_sizes)
    out = out * weights.reshape(-1)[order][:, None].astype(out.dtype)
    return jnp.zeros_like(x).at[token].add(out)


def shared_mlp(p: dict[str, jax.Array], x: Float[Array, "... d"]) -> Float[Array, "... d"]:
    dt = x.dtype
    g = jnp.einsum("...d,df->...f", x, p["shared_gate"].astype(dt))
    u = jnp.einsum("...d,df->...f", x, p["shared_up"].astype(dt))
    return jnp.einsum("...f,fd->...d", jax.nn.silu(g) * u, p["shared_down"].astype(dt))


def load_balance_loss(logits: Float[Array, "t e"], ids: Int[Array, "t k"]) -> Float[Array, ""]:
    """Expert-level balance loss of DeepSeek-V2 / Switch: E * sum_e f_e * P_e, f_e = share of the
    T*k assignments that went to e, P_e = mean router probability of e. 1 when perfectly balanced."""
    e = logits.shape[-1]
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    f = jnp.bincount(ids.reshape(-1), length=e).astype(jnp.float32) / ids.size
    return e * jnp.sum(f * jnp.mean(probs, axis=0))


def moe_forward(
    cfg: MoeConfig, p: dict[str, jax.Array], x: Float[Array, "b t d"]
) -> tuple[Float[Array, "b t d"], Float[Array, ""]]:
    """One MoE MLP: (output, load-balancing loss of this layer's routing)."""
    shape = x.shape
    flat = x.reshape(-1, shape[-1])
    weights, ids, logits = route(cfg, p["router"], flat)
    y = routed_experts(cfg, p, flat, weights, ids).reshape(shape)
    if cfg.n_shared_experts:
        y = y + shared_mlp(p, x)
    return constrain(y, ("batch", "length", "act_embed")), load_balance_loss(logits, ids)


# ----------------------------------------------------------------------------------------------
# transformers names (`DeepseekOcr2TextMoe` / `DeepseekV2Moe`, keys after the layer's `mlp.`).


def moe_arrays_from_hf(get, prefix: str, cfg: MoeConfig) -> dict[str, np.ndarray]:
    """One sparse layer's arrays in our layout; `get(name) -> ndarray` reads an HF tensor.
    HF: gate.weight [E, d]; experts.gate_up_proj [E, 2f, d] (gate rows first); experts.down_proj
    [E, d, f]; shared_experts.{gate,up,down}_proj.weight (nn.Linear [out, in])."""
    f = cfg.moe_intermediate_size
    gate_up = np.asarray(get(prefix + "experts.gate_up_proj"))
    out = {
        "router": np.asarray(get(prefix + "gate.weight")).T,
        "expert_gate": gate_up[:, :f, :].transpose(0, 2, 1),
        "expert_up": gate_up[:, f:, :].transpose(0, 2, 1),
        "expert_down": np.asarray(get(prefix + "experts.down_proj")).transpose(0, 2, 1),
    }
    if cfg.n_shared_experts:
        for ours, hf in (("shared_gate", "gate_proj"), ("shared_up", "up_proj"), ("shared_down", "down_proj")):
            out[ours] = np.asarray(get(f"{prefix}shared_experts.{hf}.weight")).T
    return out


def moe_arrays_to_hf(p: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """Inverse of `moe_arrays_from_hf` for one layer."""
    out = {
        prefix + "gate.weight": p["router"].T.astype(np.float32),
        prefix + "experts.gate_up_proj": np.concatenate(
            [p["expert_gate"].transpose(0, 2, 1), p["expert_up"].transpose(0, 2, 1)], axis=1),
        prefix + "experts.down_proj": p["expert_down"].transpose(0, 2, 1),
    }
    for ours, hf in (("shared_gate", "gate_proj"), ("shared_up", "up_proj"), ("shared_down", "down_proj")):
        if ours in p:
            out[f"{prefix}shared_experts.{hf}.weight"] = p[ours].T
    return {k: np.ascontiguousarray(v) for k, v in out.items()}
