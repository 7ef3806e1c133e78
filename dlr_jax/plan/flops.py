"""FLOPs of a jitted step, counted on its jaxpr with every loop body multiplied by its trip count.

XLA's `cost_analysis()` counts the body of a `while` loop once, so for a model whose layers run in a
`lax.scan` (and a decode loop around that) it under-reports by the layer count: 7.8e12 against 9.9e13
analytic FLOPs per chip for the 8B config on TPU v5p. Counting on the jaxpr instead sees what the
step asks for, including the backward pass and any rematerialised forward (they are ordinary
equations after differentiation), with `scan` bodies times `length` and `while` bodies times a trip
count the caller supplies (a decode loop's is its number of new tokens; unknown loops count once and
are reported).

Counted: `dot_general` (2 x output elements x contracted size), `ragged_dot_general` (the MoE's
grouped expert matmuls: each row against its own group only), `conv_general_dilated` (2 x output
elements x kernel window x input features per group), and one FLOP per output element of
elementwise arithmetic and reductions (small next to the matmuls, but softmax-heavy steps have them).
XLA may still fuse or drop work (dead recomputation): this is the program's arithmetic, not a
measurement.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import jax

# Elementwise / reduction primitives counted as one FLOP per output element.
_POINTWISE = frozenset({
    "add", "sub", "mul", "div", "max", "min", "neg", "exp", "exp2", "log", "log1p", "tanh", "logistic",
    "sqrt", "rsqrt", "pow", "integer_pow", "erf", "abs", "sign", "select_n", "reduce_sum", "reduce_max",
    "reduce_min", "cumsum", "cumlogsumexp", "cummax", "square", "sin", "cos", "atan2", "erf_inv",
})
_SUBJAXPR_KEYS = ("jaxpr", "call_jaxpr", "fun_jaxpr", "body_jaxpr")


@dataclasses.dataclass
class FlopCount:
    """matmul: dot_general + conv FLOPs; pointwise: elementwise + reductions; unknown_loops: while loops
    counted once because no trip count was given."""

    matmul: float = 0.0
    pointwise: float = 0.0
    unknown_loops: int = 0

    @property
    def total(self) -> float:
        return self.matmul + self.pointwise

    def scaled(self, k: float) -> FlopCount:
        return FlopCount(self.matmul * k, self.pointwise * k, self.unknown_loops)

    def __iadd__(self, other: FlopCount) -> FlopCount:
        self.matmul += other.matmul
        self.pointwise += other.pointwise
        self.unknown_loops += other.unknown_loops
        return self


def _size(aval: Any) -> float:
    shape = getattr(aval, "shape", ())
    return float(math.prod(shape)) if shape else 1.0


def dot_flops(lhs_shape: tuple[int, ...], out_shape: tuple[int, ...], dimension_numbers: Any) -> float:
    (lhs_contract, _), _ = dimension_numbers
    contracted = math.prod(lhs_shape[d] for d in lhs_contract) if lhs_contract else 1
    return 2.0 * math.prod(out_shape) * contracted


def ragged_dot_flops(lhs_shape: tuple[int, ...], out_shape: tuple[int, ...], group_sizes_shape: tuple[int, ...],
                     numbers: jax.lax.RaggedDotDimensionNumbers) -> float:
    """A grouped matmul (`jax.lax.ragged_dot`, the MoE's experts): each row meets one group's weights, so
    it costs what the dense dot of its rows would. Ragged on a non-contracted dim (the forward, the input
    gradient): 2 x output x contracted, as `dot_flops`. Ragged on the contracted dim (the weight
    gradient, output [groups, ...]): each group contracts only its own rows, so that count / groups (the last
    dim of `group_sizes`, which is [batch..., groups] when the dot has batch dims)."""
    dense = dot_flops(lhs_shape, out_shape, numbers.dot_dimension_numbers)
    (lhs_contract, _), _ = numbers.dot_dimension_numbers
    if set(numbers.lhs_ragged_dimensions) & set(lhs_contract):
        return dense / max(group_sizes_shape[-1], 1)
    return dense


def conv_flops(lhs_shape: tuple[int, ...], rhs_shape: tuple[int, ...], out_shape: tuple[int, ...],
               dimension_numbers: Any, feature_group_count: int) -> float:
    # rhs spec: (out feature dim, in feature dim, *spatial)
    rhs_spec = dimension_numbers.rhs_spec
    in_features = rhs_shape[rhs_spec[1]]
    window = math.prod(rhs_shape[d] for d in rhs_spec[2:])
    del lhs_shape, feature_group_count  # the kernel's in-feature dim is already per group
    return 2.0 * math.prod(out_shape) * window * in_features


def _sub_jaxprs(params: Mapping[str, Any]) -> list[Any]:
    out = []
    for k in _SUBJAXPR_KEYS:
        if k in params:
            out.append(params[k])
    if "branches" in params:  # cond: count the most expensive branch
        out.append(("branches", params["branches"]))
    return out


def count_jaxpr(jaxpr: Any, while_trips: Callable[[Any], int | None] | None = None) -> FlopCount:
    """FLOPs of a (closed) jaxpr; `while_trips(eqn) -> int | None` gives a while loop's trip count."""
    inner = getattr(jaxpr, "jaxpr", jaxpr)
    total = FlopCount()
    for eqn in inner.eqns:
        name = eqn.primitive.name
        p = eqn.params
        if name == "dot_general":
            total.matmul += dot_flops(eqn.invars[0].aval.shape, eqn.outvars[0].aval.shape, p["dimension_numbers"])
        elif name == "ragged_dot_general":
            total.matmul += ragged_dot_flops(eqn.invars[0].aval.shape, eqn.outvars[0].aval.shape,
                                             eqn.invars[2].aval.shape, p["ragged_dot_dimension_numbers"])
        elif name == "conv_general_dilated":
            total.matmul += conv_flops(eqn.invars[0].aval.shape, eqn.invars[1].aval.shape,
                                       eqn.outvars[0].aval.shape, p["dimension_numbers"], p["feature_group_count"])
        elif name == "scan":
            total += count_jaxpr(p["jaxpr"], while_trips).scaled(p["length"])
        elif name == "while":
            body = count_jaxpr(p["body_jaxpr"], while_trips)
            body += count_jaxpr(p["cond_jaxpr"], while_trips)
            trips = while_trips(eqn) if while_trips else None
            if trips is None:
                body.unknown_loops += 1
                trips = 1
            total += body.scaled(trips)
        elif name == "cond":
            branches = [count_jaxpr(b, while_trips) for b in p["branches"]]
            total += max(branches, key=lambda c: c.total)
        elif name == "pallas_call":
            # a kernel's body runs once per grid point (the splash kernel's body skips blocks its causal
            # mask empties: this counts them, an upper bound of at most 2x on its attention FLOPs)
            grid = math.prod(p["grid_mapping"].grid)
            total += count_jaxpr(p["jaxpr"], while_trips).scaled(grid)
        elif name in _POINTWISE:
            total.pointwise += sum(_size(v.aval) for v in eqn.outvars)
        else:
            for sub in _sub_jaxprs(p):
                if isinstance(sub, tuple):
                    continue
                total += count_jaxpr(sub, while_trips)
    return total


def count_fn(fn: Callable, *args: Any, while_trips: Callable[[Any], int | None] | None = None,
             **kwargs: Any) -> FlopCount:
    """FLOPs of `fn(*args, **kwargs)` (args may be ShapeDtypeStructs: nothing is computed)."""
    return count_jaxpr(jax.make_jaxpr(fn)(*args, **kwargs), while_trips)


def dense_lm_flops(cfg: Any, tokens: int, seq_len: int, *, backward: bool = True, recompute: bool = False,
                   vocab: int | None = None) -> float:
    """The analytic count for a dense decoder (`dlr_jax.config.ModelConfig`): 2 x (matmul params) per token
    forward (embedding lookups are free, the LM head is not), attention scores and values
    2 x 2 x seq x heads x head_dim per token per layer (causal: every query attends to its whole padded
    row here, as our masked implementation computes), x3 with the backward pass; `recompute` (full remat)
    adds one more forward of the layers."""
    d, hd = cfg.hidden_size, cfg.head_dim
    attn = d * hd * (cfg.num_heads * 2 + cfg.num_kv_heads * 2)
    mlp = 3 * d * cfg.intermediate_size
    head = d * (vocab or cfg.vocab_size)
    layers = 2 * cfg.num_layers * (attn + mlp) + cfg.num_layers * 4 * seq_len * cfg.num_heads * hd
    passes = 3 if backward else 1
    return float(tokens * ((passes + (1 if recompute and backward else 0)) * layers + passes * 2 * head))


def as_dict(c: FlopCount) -> dict[str, Any]:
    return {"flops": c.total, "matmul_flops": c.matmul, "pointwise_flops": c.pointwise,
            "loops_counted_once": c.unknown_loops}


__all__ = ["FlopCount", "as_dict", "conv_flops", "count_fn", "count_jaxpr", "dense_lm_flops", "dot_flops",
           "ragged_dot_flops"]
