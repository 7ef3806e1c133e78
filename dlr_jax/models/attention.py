"""Attention and the projections of the decoder (models/transformer.py): grouped-query attention on
the backend the compile target has (XLA einsums, cuDNN flash, TPU splash), `dense` for every
projection (one 2-D matmul on CPU, the einsum elsewhere; `OutMajor` weights for CPU decode steps),
and the causal-within-segment mask.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from dlr_jax.core.sharding import get_abstract_mesh
from dlr_jax.models.splash import splash_attention, splash_fits

NEG_INF = -1e30  # finite, so fully-masked (padding) query rows give uniform weights, not NaN


def target_platform() -> str:
    """The platform the code being traced is compiled for: the ambient mesh's devices (a deviceless
    H100 or TPU mesh when planning from a CPU host), else the default backend."""
    mesh = get_abstract_mesh()
    device = None if mesh is None or mesh.empty else getattr(mesh, "abstract_device", None)
    platform = getattr(device, "platform", None)
    return str(platform) if platform else jax.default_backend()


def resolve_attention(name: str, platform: str, dtype: Any, splash_ok: bool = False) -> str:
    """`model.attention` -> "xla" (the einsum below), "cudnn" (jax.nn.dot_product_attention's cuDNN
    flash kernel) or "splash" (the TPU Pallas kernel, models/splash.py). auto: cudnn on GPU targets for
    bf16/fp16 (what the kernel supports), splash on TPU where `splash_ok` (causal self-attention within
    segments over whole 128-blocks: training and scoring, not decode steps), else xla.
    An explicit kernel on a target without it runs the same maths elsewhere — cudnn as XLA's
    dot_product_attention, splash in Pallas interpret mode ("splash_interpret") — so a GPU or TPU
    config still runs in CPU tests."""
    gpu, tpu = platform in ("gpu", "cuda"), platform == "tpu"
    if name in ("xla", "einsum"):
        return "xla"
    if name == "auto":
        if gpu and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16):
            return "cudnn"
        return "splash" if tpu and splash_ok else "xla"
    if name == "cudnn":
        return "cudnn" if gpu else "dot_product_attention"
    if name == "splash":
        return ("splash" if tpu else "splash_interpret") if splash_ok else "xla"
    raise ValueError(f"model.attention must be auto|xla|cudnn|splash (einsum = xla), got {name!r}")


def attention(
    q: Float[Array, "b t h hd"],
    k: Float[Array, "b s kv hd"],
    v: Float[Array, "b s kv hd"],
    mask: Bool[Array, "b t s"],
    backend: str = "auto",
    segment_ids: Int[Array, "b t"] | None = None,
    kv_heads_major: bool = False,
) -> Float[Array, "b t h hd"]:
    """Grouped-query attention; query heads are grouped per KV head so K/V are never repeated.
    `backend`: `model.attention`, resolved for the compile target (`resolve_attention`).
    `segment_ids`, when given, say `mask` is `causal_mask(segment_ids)` (what the splash kernel takes).
    `kv_heads_major`: `k` and `v` are [b, kv, s, hd] (the KV cache's layout), read by the matmuls as
    they are; the other backends get them transposed back."""
    b, t, h, hd = q.shape
    if kv_heads_major and resolve_attention(backend, target_platform(), q.dtype) != "xla":
        k, v, kv_heads_major = k.swapaxes(1, 2), v.swapaxes(1, 2), False
    kv, s = (k.shape[1], k.shape[2]) if kv_heads_major else (k.shape[2], k.shape[1])
    splash_ok = segment_ids is not None and splash_fits(t, s)
    impl = resolve_attention(backend, target_platform(), q.dtype, splash_ok)
    if impl == "cudnn" and (t % 2 or s % 2):
        # the cuDNN flash kernel's backward takes a mask (its bias) over even lengths only; the OCR-2 decoder's
        # rows (<bos>, N ids, separator, prompt, targets) are odd for every other canvas size
        impl = "xla"
    if impl.startswith("splash"):
        return splash_attention(q, k, v, segment_ids, interpret=impl == "splash_interpret")
    if impl != "xla":
        return jax.nn.dot_product_attention(q, k, v, mask=mask[:, None],
                                            implementation="cudnn" if impl == "cudnn" else None)
    qg = q.reshape(b, t, kv, h // kv, hd)
    ks = "bksd" if kv_heads_major else "bskd"
    scores = jnp.einsum(f"btkgd,{ks}->bkgts", qg, k, preferred_element_type=jnp.float32)
    # The mask as an additive bias on [b, 1, 1, t, s]: XLA fuses the broadcast into the add, where a
    # select would fill a [b, kv, g, t, s] buffer with NEG_INF and select again in the backward. Equal
    # to the select: |scores| is far below NEG_INF's ulp, so a masked score is exactly NEG_INF.
    bias = jnp.where(mask, 0.0, NEG_INF).astype(scores.dtype)
    scores = scores / math.sqrt(hd) + bias[:, None, None]
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    if kv_heads_major:  # [b, kv, g, t, hd] first: XLA then multiplies P @ V as they lie
        out = jnp.einsum("bkgts,bksd->bkgtd", probs, v).transpose(0, 3, 1, 2, 4)
    else:
        out = jnp.einsum("bkgts,bskd->btkgd", probs, v)
    return out.reshape(b, t, h, hd)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class OutMajor:
    """A projection weight stored output dims first, [*out, *in] (PyTorch's layout), which `dense`
    multiplies as `wt @ x^T` for the few rows of a CPU decode step. Why: a decode step is bound by streaming
    weights that are not in cache, and XLA:CPU's dot kernels (Eigen's, and YNNPACK's individual dots, which
    the CPU decode loop uses) stream a skinny product faster as [n, k] @ [k, rows] than as [rows, k] @ [k, n]
    (BENCHMARKS.md, section "Greedy sampling"; `python -m dlr_jax.bench --only sampling`).
    `n_in`: how many trailing dims of `wt` are contracted."""

    wt: Float[Array, "*out_in"]
    n_in: int = dataclasses.field(default=1, metadata={"static": True})

    @staticmethod
    def of(w: Float[Array, "*in_out"], n_in: int = 1) -> OutMajor:
        """`w` [*in, *out] (this package's layout) as [*out, *in]: one copy. The barrier keeps XLA from
        folding the transpose back into the matmul, which would undo the layout."""
        wt = jnp.moveaxis(w, tuple(range(n_in)), tuple(range(w.ndim - n_in, w.ndim)))
        return OutMajor(jax.lax.optimization_barrier(wt), n_in)

    def astype(self, dtype: Any) -> OutMajor:
        return OutMajor(self.wt.astype(dtype), self.n_in)


def _dense_out_major(x: Float[Array, "*lead k"], w: OutMajor, out_dtype: Any) -> Float[Array, "*lead ..."]:
    lead, inner = x.shape[: x.ndim - w.n_in], x.shape[x.ndim - w.n_in:]
    out = w.wt.shape[: w.wt.ndim - w.n_in]
    k = math.prod(inner)
    # The barriers pin both small transposes: without them XLA's simplifier turns (wt @ x^T)^T back
    # into x @ wt^T, the slowest form of all on XLA:CPU (a transposed weight operand).
    barrier = jax.lax.optimization_barrier
    y = jnp.dot(w.wt.reshape(-1, k), barrier(x.reshape(-1, k).T), preferred_element_type=out_dtype)
    return barrier(y).T.reshape(*lead, *out)


def dense(x: Float[Array, "*lead k"], w: Float[Array, "k ..."] | OutMajor, contract: int = 1,
          out_dtype: Any = None) -> Float[Array, "*lead ..."]:
    """`x`'s last `contract` dims times `w`'s first ones. On CPU as one 2-D matmul over the flattened
    leading dims ([b, t, d] -> [b*t, d]): the einsum's weight gradient contracts two dims (b, t), and
    XLA:CPU then writes the activation gradient transposed, element by element, before the matmul (a
    quarter of an SFT step's op time); the 2-D form's gradient is a plain matmul. The leading dims
    merge along `batch` (sharded) and `length` (never sharded), so the sharding holds.
    Elsewhere as the einsum: XLA:GPU's Triton GEMM tiling (jaxlib 0.10.2) fails on the 2-D form's
    weight gradient when a chunk of b*t positions is no multiple of its tile ("Couldn't find output
    tile sizes"): the lm head's of every bf16 paper config in a deviceless H100 compile.
    An `OutMajor` weight (CPU decode loops: `Transformer.layer_slices(out_major=True)`) is multiplied
    in its own layout, on any platform."""
    if isinstance(w, OutMajor):
        if w.n_in != contract:
            raise ValueError(f"an OutMajor weight contracting {w.n_in} dims, used with contract={contract}")
        return _dense_out_major(x, w, out_dtype)
    if target_platform() != "cpu":
        dims = ((tuple(range(x.ndim - contract, x.ndim)), tuple(range(contract))), ((), ()))
        return jax.lax.dot_general(x, w, dims, preferred_element_type=out_dtype)
    lead, inner = x.shape[: x.ndim - contract], x.shape[x.ndim - contract:]
    k = math.prod(inner)
    y = jnp.dot(x.reshape(-1, k), w.reshape(k, -1), preferred_element_type=out_dtype)
    return y.reshape(*lead, *w.shape[contract:])


def causal_mask(segment_ids: Int[Array, "b t"]) -> Bool[Array, "b t t"]:
    """Causal within a segment; segment 0 is padding and attends/is attended by nothing real."""
    t = segment_ids.shape[1]
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    real = segment_ids[:, None, :] != 0
    return causal[None] & same & real
