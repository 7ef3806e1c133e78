"""Load-time data checks: numeric golds (file:line / item), empty files."""

from __future__ import annotations

import json

import pytest

from dlr_jax.data.checks import is_number
from dlr_jax.data.readers import load_benchmark
from dlr_jax.data.records import DataFormatError


def test_is_number():
    for ok in ("72", "-7", "+3", "0.5", ".5", "36.", "3244047.0999999996", "2/5", "1e3", "-1.5E-2"):
        assert is_number(ok), ok
    for bad in ("", "seventy", "7 apples", "1,080,", "$5", "x=3", "nan", "3/"):
        assert not is_number(bad), bad


def test_non_numeric_gold_names_file_and_line(tmp_path):
    f = tmp_path / "train.txt"
    f.write_text("what is 1+2?||<<1+2=3>> #### 3\n\nwhat is 2+2?||<<2+2=4>> #### four\n")
    with pytest.raises(DataFormatError, match=rf"{f}:3: gold answer 'four' .* is not a number"):
        load_benchmark("gsm8k_aug", path=f, split="train")


def test_non_numeric_gold_in_a_json_array_names_the_item(tmp_path):
    f = tmp_path / "MultiArith.json"
    rows = [{"sQuestion": "1+1?", "lSolutions": [2], "lEquations": ["x=1+1"], "iIndex": 0},
            {"sQuestion": "2+2?", "lSolutions": ["many"], "lEquations": ["x=2+2"], "iIndex": 1}]
    f.write_text(json.dumps(rows))
    with pytest.raises(DataFormatError, match=r"\[item 1, 0-based\]"):
        load_benchmark("multiarith", path=f, split="all")


def test_math_golds_stay_latex(tmp_path):
    f = tmp_path / "test.jsonl"
    f.write_text(json.dumps({"problem": "p", "solution": "s", "answer": "\\frac{1}{2}", "subject": "a",
                             "level": 1, "unique_id": "u"}) + "\n")
    assert load_benchmark("math500", path=f)[0].answer == "\\frac{1}{2}"


def test_empty_file_is_an_error(tmp_path):
    f = tmp_path / "test.jsonl"
    f.write_text("\n\n")
    with pytest.raises(DataFormatError, match=rf"{f}: no examples"):
        load_benchmark("gsm8k", path=f)
