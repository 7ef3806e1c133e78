"""codebook.render_view: what of a CoT the codebook renders, its OCR decoder reads and sft's dual branch
targets."""

from pathlib import Path

import numpy as np
import pytest

from dlr_jax.config import load_config
from dlr_jax.data.cot_view import cot_view, render_texts, step_results, step_views
from dlr_jax.data.items import make_items
from dlr_jax.data.latents import LatentTable
from dlr_jax.data.ocr_rows import ocr_fields
from dlr_jax.data.records import Example
from dlr_jax.data.sources import corpus, corpus_texts, load_examples
from dlr_jax.text.ocr_text import VOCAB
from dlr_jax.text.steps import split_steps

ROOT = Path(__file__).resolve().parents[2]
SYNTH = ["data.synthetic_train=30", "data.synthetic_eval=8"]


def test_results_view_is_each_steps_result_in_order():
    cot = "<<10+9=19>> <<19-3=16>> <<16*6=96>>"
    assert cot_view(cot, "cot") == cot
    assert cot_view(cot, "results") == "19 16 96"
    assert cot_view(cot, "result_lines") == "19\n16\n96"
    assert cot_view("<<2.5*4 = 10 >> then <<10/4=2.5>>", "results") == "10 2.5"
    assert step_results("no annotation") == []


def test_results_view_names_the_example_without_a_step():
    with pytest.raises(ValueError, match="example 'q7'.*no calculator step"):
        cot_view("Add them up to get 12.", "results", example_id="q7")
    with pytest.raises(ValueError, match="render_view=result_lines: CoT"):
        cot_view("12", "result_lines")
    with pytest.raises(ValueError, match="render_view must be one of"):
        cot_view("<<1+1=2>>", "answers")


def test_corpus_texts_follow_the_view():
    full = corpus_texts(load_config(ROOT / "configs" / "tiny.yaml", SYNTH))
    cfg = load_config(ROOT / "configs" / "tiny.yaml", [*SYNTH, "codebook.render_view=results"])
    short = corpus_texts(cfg)
    examples = load_examples(cfg, cfg.data.train_split)
    assert len(short) == len(full) == len(examples) == 30
    assert short == [" ".join(step_results(ex.cot)) for ex in examples]
    assert all(set(t) <= set("0123456789 -.") for t in short)
    assert sum(map(len, short)) < sum(map(len, full)) / 3  # the point of the view: far fewer glyphs
    held = corpus_texts(cfg, held_out=True)
    assert len(held) == 8 and all("<<" not in t for t in held)


def test_step_views_are_each_step_under_the_view():
    natural = ("Ben buys 9 more marbles, so Ben has 10 + 9 = <<10+9=19>>19 marbles. Ben gives away 3 marbles, so "
               "Ben has 19 - 3 = <<19-3=16>>16 marbles left. So Ben has 16 marbles at the end.")
    assert step_views(natural, "cot") == split_steps(natural) and len(split_steps(natural)) == 3
    assert step_views(natural, "results") == ["19", "16"]  # the closing sentence holds no result: not rendered
    assert render_texts(natural, "results", "chain") == ["19 16"]
    assert render_texts(" ", "cot", "step") == [" "]  # a blank CoT is one (blank) canvas, as a chain's is
    with pytest.raises(ValueError, match="example 'q7'.*no calculator step"):
        step_views("Add them. Then 12.", "results", example_id="q7")


def test_corpus_texts_are_the_steps_under_render_unit_step():
    cfg = load_config(ROOT / "configs" / "tiny.yaml", [*SYNTH, "data.synthetic_cot_style=natural",
                                                        "codebook.render_unit=step"])
    texts, info = corpus(cfg)
    examples = load_examples(cfg, cfg.data.train_split)
    assert texts == [s for ex in examples for s in split_steps(ex.cot)] and len(texts) > 2 * len(examples)
    assert info["render_unit"] == "step" and info["cots"] == 30 and info["texts"] == len(texts)
    assert "render_unit" not in corpus(load_config(ROOT / "configs" / "tiny.yaml", SYNTH))[1]  # the paper's record


def test_dual_branch_targets_are_the_rendered_view():
    ex = Example(id="a", question="q", cot="<<3*4=12>> <<12-5=7>>", answer="7", source="synthetic")
    item = make_items("sft", [ex], LatentTable({"a": [1, 2]}, examples={"a": ex}, num_codes=8))[0]
    for view, text in (("cot", ex.cot), ("results", "12 7")):
        out = ocr_fields(item, text_len=32, num_codes=4, view=view)
        ids = out["ocr_targets"]
        assert VOCAB.decode(ids) == text
        np.testing.assert_array_equal(out["ocr_codes"], [0, 0, 1, 2])
