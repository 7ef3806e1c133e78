import json

import pytest

from dlr_jax.data.gsm8k import equation_cot, natural_cot, read_gsm8k
from dlr_jax.data.gsm8k_aug import read_gsm8k_aug
from dlr_jax.data.records import DataFormatError

SOLUTION = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nAltogether 48+24 = <<48+24=72>>72 clips."


def test_equation_and_natural_cot():
    assert equation_cot(SOLUTION) == "<<48/2=24>> <<48+24=72>>"
    assert natural_cot(SOLUTION) == "Natalia sold 48/2 = 24 clips in May.\nAltogether 48+24 = 72 clips."
    assert equation_cot("no annotations here") == ""


def test_real_files(data_dir):
    train = read_gsm8k(data_dir / "gsm8k" / "train.jsonl", split="train")
    test = read_gsm8k(data_dir / "gsm8k" / "test.jsonl")
    assert (len(train), len(test)) == (7473, 1319)
    assert train[0].cot == "<<48/2=24>> <<48+24=72>>" and train[0].answer == "72"
    assert train[0].id == "gsm8k/train/0" and train[0].source == "gsm8k"
    assert all(ex.answer.lstrip("-").isdigit() for ex in train + test), "thousands separators removed"
    assert len({ex.id for ex in train}) == len(train)


def test_equation_cot_matches_gsm8k_aug_test(data_dir):
    """GSM8K-Aug's test CoTs are exactly the GSM8K test annotations joined by spaces."""
    gsm = read_gsm8k(data_dir / "gsm8k" / "test.jsonl")
    aug = read_gsm8k_aug(data_dir / "gsm8k_aug" / "test.txt")
    assert [(e.question, e.cot, e.answer) for e in gsm] == [(e.question, e.cot, e.answer) for e in aug]


def test_cot_styles(tmp_path):
    p = tmp_path / "g.jsonl"
    p.write_text(json.dumps({"question": "Q?", "answer": SOLUTION + "\n#### 1,072"}) + "\n")
    [eq] = read_gsm8k(p)
    [nat] = read_gsm8k(p, cot="natural")
    [raw] = read_gsm8k(p, cot="raw")
    assert eq.cot == "<<48/2=24>> <<48+24=72>>"
    assert nat.cot.startswith("Natalia sold 48/2 = 24 clips")
    assert raw.cot == SOLUTION
    assert eq.answer == "1072" and eq.extra["answer_raw"] == "1,072"
    with pytest.raises(ValueError, match="equations|natural|raw"):
        read_gsm8k(p, cot="latex")
    from dlr_jax.config.root import GSM8K_COTS

    assert {style: read_gsm8k(p, cot=style)[0].cot for style in GSM8K_COTS} == {  # every style data.gsm8k_cot takes
        "equations": eq.cot, "natural": nat.cot, "raw": raw.cot}


@pytest.mark.parametrize(
    "record, message",
    [
        ({"question": "Q"}, "missing field 'answer'"),
        ({"question": "Q", "answer": "no final line"}, "end with a line '#### <number>'"),
        ({"question": "Q", "answer": "x <<1+1=2 y\n#### 2"}, "unbalanced"),
        ({"question": 3, "answer": "#### 2"}, "'question' should be str"),
    ],
)
def test_malformed_records_name_the_line(tmp_path, record, message):
    p = tmp_path / "bad.jsonl"
    good = json.dumps({"question": "Q", "answer": "<<1+1=2>>2\n#### 2"})
    p.write_text(good + "\n" + good + "\n" + json.dumps(record) + "\n")
    with pytest.raises(DataFormatError, match=message) as ei:
        read_gsm8k(p)
    assert ei.value.line == 3 and str(ei.value).startswith(f"{p}:3:")
