"""Micro network sizes shared by the codebook-related tests: each compile takes seconds, not minutes."""

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
