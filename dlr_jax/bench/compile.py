"""Compile time of a deep vs a shallow model forward of the same width (`--only compile`): the
scanned layer stack (`model.scan_layers=scan`, forced: auto loops <= 8 layers on CPU), and as the
reference the same layers unrolled in Python."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from dlr_jax.bench.common import Size, header, model_config, timed
from dlr_jax.config import ModelConfig
from dlr_jax.models.rope import rope_inv_freq
from dlr_jax.models.transformer import (
    Transformer,
    causal_mask,
    layer_forward,
    rms_norm,
)


@dataclasses.dataclass(frozen=True)
class CompileResult:
    size: Size
    layers: tuple[int, int]
    batch: int
    seq: int
    repeats: int
    # variant ("scan" | "unrolled") -> depth -> [(lower_s, compile_s) per repeat]
    times: dict[str, dict[int, list[tuple[float, float]]]]

    def median(self, variant: str, depth: int, which: int) -> float:
        return statistics.median(t[which] for t in self.times[variant][depth])

    def ratio(self, variant: str, which: int = 1) -> float:
        shallow, deep = self.layers
        return self.median(variant, deep, which) / self.median(variant, shallow, which)


def unrolled_forward(model: Transformer, input_ids: jax.Array) -> jax.Array:
    """The same forward as `model(input_ids)` with the layers unrolled in Python: the reference
    for what the scan saves in compile time."""
    cfg = model.cfg
    x = model.embed_tokens(input_ids)
    b, t = input_ids.shape
    positions = jnp.broadcast_to(jnp.arange(t), (b, t))
    mask = causal_mask(jnp.ones((b, t), jnp.int32))
    inv_freq = rope_inv_freq(cfg)
    layers = model.layers.arrays()
    for i in range(cfg.num_layers):
        x, _ = layer_forward(cfg, {k: v[i] for k, v in layers.items()}, x, positions, mask, inv_freq)
    return model.logits_from_hidden(rms_norm(x, model.final_norm[...], cfg.rms_norm_eps))


def _forward(graphdef: nnx.GraphDef, variant: str) -> Callable[[nnx.State, jax.Array], jax.Array]:
    # A new closure per call: jax's tracing and compilation caches cannot serve a previous result.
    def fwd(state: nnx.State, ids: jax.Array) -> jax.Array:
        model = nnx.merge(graphdef, state)
        return model(ids) if variant == "scan" else unrolled_forward(model, ids)

    return fwd


def abstract_forward(cfg: ModelConfig, variant: str) -> tuple[Callable[[nnx.State, jax.Array], jax.Array], nnx.State]:
    """(a fresh forward function, its abstract params) for `variant`: "scan" forces the layer scan (scan_layers
    auto runs <= 8 layers as a plain loop on CPU, which would make the shallow row unrolled too)."""
    if variant == "scan":
        cfg = dataclasses.replace(cfg, scan_layers="scan")
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
    return _forward(graphdef, variant), state


def time_compile(cfg: ModelConfig, variant: str, batch: int, seq: int) -> tuple[float, float]:
    """(lower_s, compile_s) of a fresh `jax.jit` of the forward, on abstract params (nothing is
    materialised, so deep models cost no memory)."""
    fwd, state = abstract_forward(cfg, variant)
    ids = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    lower_s, lowered = timed(lambda: jax.jit(fwd).lower(state, ids))
    compile_s, _ = timed(lowered.compile)
    return lower_s, compile_s


def bench_compile(size: Size, *, layers: tuple[int, int] = (4, 32), batch: int = 16, seq: int = 64,
                  repeats: int = 3, variants: Sequence[str] = ("scan", "unrolled"),
                  log: Callable[[str], None] = print) -> CompileResult:
    times: dict[str, dict[int, list[tuple[float, float]]]] = {v: {n: [] for n in layers} for v in variants}
    time_compile(model_config(size, layers[0]), variants[0], batch, seq)  # one-off tracing/XLA warm-up
    for r in range(repeats):
        for variant in variants:
            for n in layers if r % 2 == 0 else layers[::-1]:  # alternate order: drift hits both depths
                lower_s, compile_s = time_compile(model_config(size, n), variant, batch, seq)
                times[variant][n].append((lower_s, compile_s))
                log(f"compile: repeat {r + 1}/{repeats} {variant} {n} layers: lower {lower_s:.2f}s, "
                    f"compile {compile_s:.2f}s")
    return CompileResult(size, layers, batch, seq, repeats, times)



def render_compile(res: CompileResult, command: str, info: dict[str, str]) -> str:
    shallow, deep = res.layers
    lines = header(f"Compile time: {deep}-layer vs {shallow}-layer forward", command, info) + [
        f"Model width: {res.size.describe().split(', ', 1)[0]}, "
        f"{res.size.describe().split(', ', 2)[2]}; forward of [{res.batch}, {res.seq}] token ids on abstract "
        "params. `lower` = trace + lower to StableHLO, `compile` = XLA CPU compile "
        "(`jax.jit(f).lower(...).compile()`, a fresh function each time). "
        f"Median of {res.repeats} repeats, all in one process.",
        "",
        f"| layer stack | lower s ({shallow} / {deep} layers) | compile s ({shallow} / {deep} layers) "
        f"| compile ratio {deep}/{shallow} | lower+compile ratio |",
        "|---|---|---|---|---|",
    ]
    for variant in res.times:
        lo = [res.median(variant, n, 0) for n in res.layers]
        co = [res.median(variant, n, 1) for n in res.layers]
        tot = (lo[1] + co[1]) / (lo[0] + co[0])
        name = ("scanned (`lax.scan`: `model.scan_layers` auto above 8 layers on CPU, always on GPU / TPU)"
                if variant == "scan" else "unrolled (reference)")
        lines.append(f"| {name} | {lo[0]:.2f} / {lo[1]:.2f} | {co[0]:.2f} / {co[1]:.2f} "
                     f"| **{res.ratio(variant):.2f}x** | {tot:.2f}x |")
    scan = res.ratio("scan")
    lines += ["", f"Interpretation: with the layers scanned, {deep / shallow:.0f}x the depth costs "
              f"{scan:.2f}x the compile time ({'within' if scan < 1.5 else 'over'} the 1.5x budget)"
              + (f", against {res.ratio('unrolled'):.2f}x when the same layers are unrolled."
                 if "unrolled" in res.times else ".")]
    return "\n".join(lines) + "\n"

