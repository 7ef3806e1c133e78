"""The codebook network: char vocabulary, config plumbing, any N through the model, greedy decoding."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dlr_jax.config import ConfigError, load_config
from dlr_jax.models.codebook_model import (
    CodebookModelConfig,
    build_codebook_model,
    char_dropout,
    greedy_decode,
    teacher_inputs,
)
from dlr_jax.text import render
from dlr_jax.text.ocr_text import VOCAB, encode_target, normalize_text
from tests.micro import codebook_nets

ROOT = Path(__file__).resolve().parents[2]
MICRO = [
    "codebook.max_side=256", "codebook.image_size=128", "codebook.max_text_len=24",
    *codebook_nets(num_queries=16, dec_layers=2),
    "latent.num_latents=32", "latent.latent_dim=16",
]


@pytest.fixture(scope="module")
def mcfg():
    return CodebookModelConfig.from_config(load_config(ROOT / "configs" / "tiny.yaml", MICRO))


@pytest.fixture(scope="module")
def model(mcfg):
    return build_codebook_model(mcfg, seed=0)


def test_char_vocab_round_trip():
    text = "<<48/2=24>> <<48+24=72>>\nx = 3.5%"
    ids = VOCAB.encode(text)
    assert min(ids) >= VOCAB.NUM_SPECIAL and max(ids) < VOCAB.size <= VOCAB.padded_size()
    assert VOCAB.decode(ids + [VOCAB.EOS] + VOCAB.encode("ignored")) == text
    assert VOCAB.decode(VOCAB.encode("é")) == "\ufffd"  # unknown characters are visible, not dropped
    assert VOCAB.decode([VOCAB.BOS, VOCAB.PAD, VOCAB.DROP] + VOCAB.encode("a")) == "a"


def test_normalize_text_matches_the_renderer():
    text = "  a   b\t c  \n\n  <<1+2=3>>   <<3*4=12>>  \n\n"
    norm = normalize_text(text)
    assert norm == "a b c\n\n<<1+2=3>> <<3*4=12>>"
    # the renderer's own paragraphs / words, before wrapping
    assert "\n".join(" ".join(words) for words in render.split_paragraphs(text)) == norm


def test_encode_target_cuts_and_counts():
    t, cut = encode_target("abc", 8)
    assert VOCAB.decode(t) == "abc" and not cut and t[3] == VOCAB.EOS and np.all(t[4:] == VOCAB.PAD)
    t, cut = encode_target("abcdefghij", 6)
    assert cut and VOCAB.decode(t) == "abcde" and t[-1] == VOCAB.EOS


def test_teacher_inputs_and_char_dropout():
    targets = jnp.asarray([encode_target("hello world", 16)[0], encode_target("hi", 16)[0]])
    inputs, mask = teacher_inputs(targets)
    assert int(inputs[0, 0]) == VOCAB.BOS and np.array_equal(inputs[:, 1:], targets[:, :-1])
    assert np.array_equal(np.asarray(mask).sum(1), [13, 4])  # <bos> + chars + <eos>
    assert char_dropout(inputs, 0.0, jax.random.key(0)) is inputs
    big = jnp.tile(inputs, (200, 1))
    dropped = np.asarray(char_dropout(big, 0.5, jax.random.key(1)))
    is_char = np.asarray(big) >= VOCAB.NUM_SPECIAL
    assert np.all(dropped[~is_char] == np.asarray(big)[~is_char])  # <bos>/<eos>/<pad> untouched
    rate = np.mean(dropped[is_char] == VOCAB.DROP)
    assert 0.45 < rate < 0.55
    assert np.all((dropped == VOCAB.DROP) | (dropped == np.asarray(big)))


def test_config_checks_and_meta_round_trip(mcfg):
    assert mcfg.code_dim == 16 and mcfg.num_codes == 32 and mcfg.num_queries == 16
    assert mcfg.encoder.vision.global_attn_indexes == (1,)
    assert CodebookModelConfig.from_dict(mcfg.to_dict()) == mcfg
    with pytest.raises(ConfigError, match="query pool"):
        CodebookModelConfig.from_config(load_config(ROOT / "configs" / "tiny.yaml", [*MICRO, "codebook.max_side=320"]))
    with pytest.raises(ConfigError, match="vit_global_every"):
        CodebookModelConfig.from_config(load_config(ROOT / "configs" / "tiny.yaml", [*MICRO, "codebook.vit_layers=3"]))


@pytest.mark.parametrize("side", [64, 256])
def test_encoder_gives_n_tokens_up_to_the_pool(model, side):
    images = np.full((2, side, side), 255, np.uint8)
    images[1, 8:20, 8:40] = 0
    h = jax.jit(lambda x: model.encode(x))(images)
    n = (side // 64) ** 2  # 1 and 16 = the whole query pool
    assert h.shape == (2, n, 16) and np.all(np.isfinite(h))
    assert not np.allclose(h[0], h[1])  # the image content reaches the features


def test_encoder_inputs_are_checked_at_trace_time(model):
    with pytest.raises(AssertionError, match="assert_type"):  # 0..255 floats would be mis-normalised
        jax.eval_shape(model.encode, jax.ShapeDtypeStruct((2, 64, 64), jnp.float32))
    with pytest.raises(AssertionError, match="assert_axis_dimension"):  # canvases are square
        jax.eval_shape(model.encode, jax.ShapeDtypeStruct((2, 64, 128), jnp.uint8))
    assert jax.eval_shape(model.encode, jax.ShapeDtypeStruct((2, 64, 64), jnp.uint8)).shape == (2, 1, 16)


def test_decoder_takes_any_prefix_length(model):
    targets = jnp.asarray([encode_target("1+2=3", 12)[0]] * 2)
    inputs, mask = teacher_inputs(targets)
    fn = jax.jit(model.decoder_logits)
    for n in (1, 3, 16):
        feats = jax.random.normal(jax.random.key(n), (2, n, 16))
        logits = fn(feats, inputs, mask)
        assert logits.shape == (2, 12, model.cfg.decoder.vocab_size)


def test_greedy_decode_matches_stepwise_argmax_and_respects_limits(model):
    """The KV-cache while_loop picks what re-running the full teacher-forced decoder would pick."""
    n, max_len = 3, 10
    feats = jax.random.normal(jax.random.key(3), (3, n, 16))
    limits = np.asarray([10, 4, 1])
    out = greedy_decode(model, feats, limits, max_len)
    assert out.shape == (3, max_len) and out.dtype == np.int32
    step = jax.jit(model.decoder_logits)
    allowed = np.zeros(model.cfg.decoder.vocab_size, bool)
    allowed[VOCAB.NUM_SPECIAL : VOCAB.size] = True
    allowed[VOCAB.EOS] = True
    for r in range(3):
        seq: list[int] = []
        for _ in range(limits[r]):
            inputs = np.full((1, max_len), VOCAB.PAD, np.int32)
            inputs[0, 0] = VOCAB.BOS
            inputs[0, 1 : 1 + len(seq)] = seq
            logits = np.asarray(step(feats[r : r + 1], inputs, inputs != VOCAB.PAD))[0, len(seq)]
            seq.append(int(np.argmax(np.where(allowed, logits, -np.inf))))
            if seq[-1] == VOCAB.EOS:
                break
        assert out[r, : len(seq)].tolist() == seq, r
        assert np.all(out[r, len(seq) :] == VOCAB.PAD)


def test_left_padded_prefixes_decode_as_alone(model):
    """Rows of different prefix lengths share one call: left padding is masked, positions start at 0."""
    feats = np.asarray(jax.random.normal(jax.random.key(5), (2, 8, 16)))
    alone = [greedy_decode(model, feats[r : r + 1, 8 - n :], [12], 12) for r, n in enumerate((3, 8))]
    padded = feats.copy()
    padded[0, :5] = 100.0  # garbage in the padding must not matter
    both = greedy_decode(model, padded, [12, 12], 12, n_valid=[3, 8])
    assert np.array_equal(both[0], alone[0][0]) and np.array_equal(both[1], alone[1][0])


def test_code_dim_and_flow_width_are_separate_settings():
    """d_c = latent.latent_dim; codebook.flow_hidden sets the flow (0 = d_c, the DeepEncoder V2 layout)."""
    same = CodebookModelConfig.from_config(load_config(ROOT / "configs" / "tiny.yaml", MICRO))
    assert same.encoder.flow.hidden_size == same.code_dim == 16 and same.encoder.code_dim == 0
    wide = load_config(ROOT / "configs" / "tiny.yaml", [*MICRO, "codebook.flow_hidden=24"])
    cfg = CodebookModelConfig.from_config(wide)
    assert cfg.encoder.flow.hidden_size == 24 and cfg.encoder.vision.out_channels == 24 and cfg.code_dim == 16
    assert CodebookModelConfig.from_dict(cfg.to_dict()) == cfg
    m = build_codebook_model(cfg, seed=0)
    assert m.vq.codebook[...].shape == (32, 16) and m.encoder.code_proj[...].shape == (24, 16)
    h = jax.jit(m.encode)(np.zeros((2, 128, 128), np.uint8))
    assert h.shape == (2, 4, 16)
    recipe = CodebookModelConfig.from_config(load_config(ROOT / "configs" / "paper" / "gsm8k.yaml"))
    flow = recipe.encoder.flow
    assert (flow.hidden_size, flow.num_layers, flow.num_heads * flow.head_dim, recipe.code_dim) == (896, 24, 896, 896)
