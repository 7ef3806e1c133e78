import pytest

from dlr_jax.config import Config, ConfigError, apply_overrides, load_config, save_config


def test_yaml_and_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("model:\n  hidden_size: 32\n  num_heads: 2\n  num_kv_heads: 1\nmesh:\n  fsdp: 2\n")
    cfg = load_config(p, ["model.num_layers=3", "model.rope_theta=1e4", "model.tie_embeddings=true"])
    assert cfg.model.hidden_size == 32 and cfg.model.num_layers == 3
    assert cfg.model.rope_theta == 10000.0 and cfg.model.tie_embeddings is True
    assert cfg.mesh.fsdp == 2
    out = tmp_path / "saved.yaml"
    save_config(cfg, out)
    assert load_config(out) == cfg


def test_unknown_keys_list_valid_ones(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("model:\n  hiden_size: 32\n")
    with pytest.raises(ConfigError, match=r"model\.hiden_size.*valid keys.*hidden_size"):
        load_config(p)
    with pytest.raises(ConfigError, match="unknown key 'nope'"):
        apply_overrides(Config(), ["model.nope=1"])
    with pytest.raises(ConfigError, match="expected an int"):
        apply_overrides(Config(), ["model.num_layers=abc"])
    with pytest.raises(ConfigError, match="key.path=value"):
        apply_overrides(Config(), ["model.num_layers"])


def test_invalid_values_are_rejected():
    with pytest.raises(ConfigError, match="multiple of num_kv_heads"):
        apply_overrides(Config(), ["model.num_heads=3"])
    with pytest.raises(ConfigError, match="not found"):
        load_config("/nonexistent.yaml")


def test_dtypes_mesh_rules_and_optimizers_are_checked_when_the_config_loads():
    """Before, these failed deep inside a stage (a TypeError, a KeyError, a ValueError) after the workdir and
    its config.yaml were written, so the fixed value then needed run.allow_config_change."""
    from dlr_jax.config.model import MESH_RULES
    from dlr_jax.core.sharding import RULES

    cfg = apply_overrides(Config(), ["model.dtype=bf16", "model.param_dtype=fp32", "codebook.dtype=bf16"])
    assert (cfg.model.dtype, cfg.model.param_dtype, cfg.codebook.dtype) == ("bfloat16", "float32", "bfloat16")
    for override, key in (("model.dtype=bfloat61", "model.dtype"), ("model.param_dtype=int8", "model.param_dtype"),
                          ("codebook.param_dtype=float64", "codebook.param_dtype")):
        with pytest.raises(ConfigError, match=rf"{key} must be one of float32\|bfloat16\|float16 .*got"):
            apply_overrides(Config(), [override])
    assert apply_overrides(Config(), ["rl.sample_dtype=bf16"]).rl.sample_dtype == "bfloat16"
    assert apply_overrides(Config(), ["rl.sample_dtype=keep"]).rl.sample_dtype == "keep"
    with pytest.raises(ConfigError, match=r"rl.sample_dtype must be one of auto\|keep\|float32\|bfloat16"):
        apply_overrides(Config(), ["rl.sample_dtype=int8"])
    with pytest.raises(ConfigError, match=r"mesh.rules must be one of fsdp\|tp\|tpu, got 'ddp'"):
        apply_overrides(Config(), ["mesh.rules=ddp"])
    assert set(MESH_RULES) == set(RULES)
    for stage in ("textsft", "rl"):
        with pytest.raises(ConfigError, match=r"optimizer must be one of adamw\|sgd, got 'adam'"):
            apply_overrides(Config(), [f"train.{stage}.optimizer=adam"])


def test_sampling_unstack_layers_takes_auto_on_off():
    assert Config().sampling.unstack_layers == "auto" and Config().sampling.unstack is None
    cases = (("on", "on", True), ("off", "off", False), ("true", "on", True), ("false", "off", False))
    for given, mode, option in cases:
        cfg = apply_overrides(Config(), [f"sampling.unstack_layers={given}"])
        assert cfg.sampling.unstack_layers == mode and cfg.sampling.unstack is option
    with pytest.raises(ConfigError, match=r"sampling\.unstack_layers must be auto\|on\|off, got 'fast'"):
        apply_overrides(Config(), ["sampling.unstack_layers=fast"])


def test_latent_curriculum_is_a_named_key_off_in_the_paper_configs():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "configs"
    for f in [*sorted((root / "paper").glob("*.yaml")), *sorted(root.glob("qwen3-4b*.yaml"))]:
        assert load_config(f).latent.curriculum == "off", f
    cfg = apply_overrides(Config(), ["latent.curriculum=stagewise", "latent.curriculum_stages=0.2"])
    assert (cfg.latent.curriculum, cfg.latent.curriculum_stages) == ("stagewise", 0.2)
    assert apply_overrides(cfg, ["latent.curriculum=off"]).latent.curriculum == "off"
    with pytest.raises(ConfigError, match=r"latent\.curriculum must be one of off\|stagewise\|random"):
        apply_overrides(Config(), ["latent.curriculum=always"])
    with pytest.raises(ConfigError, match=r"latent\.curriculum_stages must be in \(0, 1\]"):
        apply_overrides(Config(), ["latent.curriculum_stages=0"])


def test_every_shipped_config_loads():
    from pathlib import Path

    files = sorted((Path(__file__).resolve().parents[2] / "configs").rglob("*.yaml"))
    assert files, "no configs shipped"
    for f in files:
        load_config(f)


def test_model_config_is_hashable_with_rope_scaling():
    # Configs are static jit arguments (inside NNX graph definitions): they must hash.
    from dlr_jax.config import ModelConfig

    a = ModelConfig(rope_scaling={"rope_type": "llama3", "factor": 8.0})
    b = ModelConfig(rope_scaling={"rope_type": "llama3", "factor": 8.0})
    assert hash(a) == hash(b) and a == b
    with pytest.raises(TypeError, match="immutable"):
        a.rope_scaling["factor"] = 2.0


def test_an_unreadable_or_invalid_config_is_one_line_naming_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  hidden_size: 64\n  num_layers: [1, 2\n")
    with pytest.raises(ConfigError) as e:
        load_config(bad)
    assert str(e.value).startswith(f"{bad}:4:1: invalid YAML: ") and "\n" not in str(e.value)
    (tmp_path / "folder.yaml").mkdir()  # e.g. a mistyped path that names a folder
    with pytest.raises(ConfigError, match="folder.yaml: cannot read this config: IsADirectoryError"):
        load_config(tmp_path / "folder.yaml")
    (tmp_path / "binary.yaml").write_bytes(b"model: \xff\xfe\n")
    with pytest.raises(ConfigError, match="binary.yaml: cannot read this config: UnicodeDecodeError"):
        load_config(tmp_path / "binary.yaml")


def test_loss_reduction_is_checked_and_defaults_to_the_mean():
    """mean by default (the CPU configs keep their numbers); the paper's sums are set by configs/paper/*.yaml."""
    cfg = apply_overrides(Config(), ["codebook.train.loss_reduction=sum", "train.sft.loss_reduction=sum"])
    assert (cfg.codebook.train.loss_reduction, cfg.train.sft.loss_reduction) == ("sum", "sum")
    assert Config().train.align.loss_reduction == Config().codebook.train.loss_reduction == "mean"
    with pytest.raises(ConfigError, match="loss_reduction must be one of mean|sum, got 'token'"):
        apply_overrides(Config(), ["train.align.loss_reduction=token"])
    with pytest.raises(ConfigError, match="train.rl.loss_reduction must stay mean.*rl.loss_agg_mode"):
        apply_overrides(Config(), ["train.rl.loss_reduction=sum"])
