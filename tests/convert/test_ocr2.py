"""deepseek_ocr2 conversion: `load_hf` and the CLI recognise the model type; --from-hf then --to-hf
gives a checkpoint transformers loads with equal logits; both tensor namings read the same."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flax import nnx

from dlr_jax.convert import load_hf
from dlr_jax.convert.cli import main
from dlr_jax.convert.ocr2 import load_ocr2_orbax
from dlr_jax.convert.ocr2_names import HFTensors, to_disk_names
from dlr_jax.models.ocr2 import Ocr2Model
from tests.hf_fixtures import build_tiny_ocr2

TOL = 1e-4


@pytest.mark.slow
def test_cli_round_trip_through_orbax(tmp_path):
    import transformers as tf

    ref = build_tiny_ocr2(seed=3)
    ref.save_pretrained(tmp_path / "hf")
    cfg, model = load_hf(tmp_path / "hf")
    assert isinstance(model, Ocr2Model) and cfg.text.mlp_layer_types == ("dense", "sparse", "sparse")
    main(["--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "orbax"), "--mesh", "data=1,fsdp=1,tensor=1"])
    _, restored = load_ocr2_orbax(tmp_path / "orbax")
    ids = np.random.default_rng(0).integers(0, 150, (2, 13))
    np.testing.assert_array_equal(np.asarray(nnx.jit(lambda m, x: m(x))(restored, ids)),
                                  np.asarray(nnx.jit(lambda m, x: m(x))(model, ids)))
    main(["--to-hf", "--from-orbax", str(tmp_path / "orbax"), "--out", str(tmp_path / "back"),
          "--mesh", "data=1,fsdp=1,tensor=1"])
    back = tf.DeepseekOcr2ForConditionalGeneration.from_pretrained(tmp_path / "back").eval()
    with torch.no_grad():
        want = ref(input_ids=torch.tensor(ids)).logits.numpy()
        got = back(input_ids=torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(got, want, atol=TOL, rtol=0)


def test_in_memory_and_disk_names_read_the_same(tmp_path):
    from safetensors.numpy import save_file

    ref = build_tiny_ocr2(seed=4)
    mem = {k: v.numpy() for k, v in ref.state_dict().items()}
    save_file(mem, str(tmp_path / "model.safetensors"))
    (tmp_path / "disk").mkdir()
    save_file(to_disk_names(mem), str(tmp_path / "disk" / "model.safetensors"))
    a, b = HFTensors(tmp_path), HFTensors(tmp_path / "disk")
    assert set(a) == set(b) == set(mem)
    for name, x in mem.items():
        np.testing.assert_array_equal(a[name], x, err_msg=name)
        np.testing.assert_array_equal(b[name], x, err_msg=name)


def test_load_hf_passes_both_dtypes_to_an_ocr2_checkpoint(tmp_path):
    """`load_hf(dtype=, compute_dtype=)` means the same for both families: an OCR2 directory used to get only
    the parameter dtype, and computed in it."""
    import jax

    build_tiny_ocr2(seed=0).save_pretrained(tmp_path / "hf")
    cfg, model = load_hf(tmp_path / "hf", dtype="float32", compute_dtype="bfloat16")
    assert (cfg.text.base.dtype, cfg.text.base.param_dtype) == ("bfloat16", "float32")
    assert {str(x.dtype) for x in jax.tree.leaves(nnx.state(model, nnx.Param))} == {"float32"}
