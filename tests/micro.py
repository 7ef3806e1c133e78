"""Micro network sizes shared by the codebook-related tests (each compile takes seconds, not minutes), and
a workdir of untrained micro stages for the tools that read one."""

from __future__ import annotations


def codebook_nets(*, num_queries: int, dec_layers: int = 1) -> list[str]:
    """`--set` overrides for a micro encoder (ViT 2 x d16, flow 1 x d16) and OCR decoder (d32)."""
    return [
        "codebook.vit_hidden=16", "codebook.vit_layers=2", "codebook.vit_heads=2", "codebook.vit_mlp=32",
        "codebook.vit_global_every=2", "codebook.vit_window=4", "codebook.neck_channels=8",
        "codebook.compressor_mid=8", "codebook.flow_layers=1", "codebook.flow_heads=2", "codebook.flow_kv_heads=1",
        "codebook.flow_head_dim=8", "codebook.flow_mlp=32", f"codebook.num_queries={num_queries}",
        "codebook.dec_hidden=32", f"codebook.dec_layers={dec_layers}", "codebook.dec_heads=2",
        "codebook.dec_kv_heads=1", "codebook.dec_head_dim=16", "codebook.dec_mlp=64",
    ]


def untrained_workdir(cfg, w, *, with_codebook: bool):
    """`w` in the stages' own formats, from untrained micro models: tokenizer, textsft_cot backbone
    and an sft latent LM (on the codebook stage's model and codebook.npy when `with_codebook`)."""
    import jax
    import numpy as np

    from dlr_jax.config import to_dict
    from dlr_jax.core.sharding import make_mesh
    from dlr_jax.data.sources import load_examples
    from dlr_jax.models.codebook_model import CodebookModelConfig, build_codebook_model
    from dlr_jax.run.checkpoint import save_params
    from dlr_jax.run.handoff import save_stage_model
    from dlr_jax.run.workdir import final_dir
    from dlr_jax.stages import common
    from dlr_jax.stages.latent_common import new_latent_lm

    mesh = make_mesh(1, 1, 1, devices=jax.devices()[:1])
    common.prepare_workdir(cfg, w)
    tok = common.get_tokenizer(cfg, w, load_examples(cfg, "train"))
    if with_codebook:  # before the latent LM: it takes its latent embeddings from codebook.npy
        mcfg = CodebookModelConfig.from_config(cfg)
        cb = build_codebook_model(mcfg, seed=0)
        save_params(cb, final_dir(w, "codebook"), {"stage": "codebook", "kind": "codebook",
                                                   "model": mcfg.to_dict(), "codebook": to_dict(cfg.codebook)})
        np.save(w / "codebook" / "codebook.npy", np.asarray(cb.vq.codebook[...]))
    backbone = common.new_backbone(cfg, tok, mesh)
    save_stage_model(backbone, w, "textsft_cot", kind="backbone", model_cfg=backbone.cfg)
    lm = new_latent_lm(cfg, w, tok, mesh)
    save_stage_model(lm, w, "sft", kind="latent_lm", model_cfg=lm.model_cfg)
    return w
