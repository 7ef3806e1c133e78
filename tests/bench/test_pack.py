"""`--only pack` at a toy size: packed and padded DLR-SFT steps on the stage's own batches, examples/s of each."""

from __future__ import annotations

import argparse

from dlr_jax.bench import common, pack

TOY = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1", "model.num_heads=2",
       "model.num_kv_heads=1", "model.head_dim=16", "latent.num_latents=32", "latent.latent_dim=16",
       "train.sft.batch_size=4", "mesh.fsdp=1", "data.dataset=synthetic", "data.synthetic_train=200",
       "data.max_len=128"]


def test_pack_section_at_toy_size():
    args = argparse.Namespace(pack_config=common.TINY_CONFIG, pack_set=TOY, pack_steps=2, start_load=0.0,
                              allow_load=False)
    assert pack.check_arguments(args) is None and pack.missing_inputs(args) is None
    res = pack.bench_pack(args, log=lambda _: None)
    assert all(len(res.step_s[m]) == 2 for m in pack.MODES)
    assert res.sequences["padded"] == [4, 4]  # one example a row
    assert min(res.sequences["packed"]) > 4 and res.real["packed"] > res.real["padded"]
    text = pack.render_pack(res, "python -m dlr_jax.bench --only pack", {"cpu": "x", "cores": "2", "load": "0",
                                                                        "versions": "v", "date": "d"})
    assert "| examples/s |" in text and "Packed over padded, examples/s: **" in text
    assert pack.check_arguments(argparse.Namespace(pack_steps=0)) == "--pack-steps must be >= 1, got 0"


def test_missing_data_is_named(tmp_path):
    args = argparse.Namespace(pack_config=common.TINY_CONFIG, pack_set=[f"data.path={tmp_path / 'none.txt'}"],
                              pack_steps=1)
    assert "the pack benchmark reads gsm8k_aug:train" in pack.missing_inputs(args)
