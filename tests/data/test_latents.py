import json

import pytest

from dlr_jax.data.latents import (
    LatentTable,
    default_num_latents,
    latents_path,
    random_latents,
    read_latents,
    step_result_code,
    step_result_latents,
    write_latents,
)
from dlr_jax.data.records import DataFormatError, Example
from dlr_jax.data.synthetic import generate
from dlr_jax.text.steps import split_steps


@pytest.fixture(scope="module")
def examples():
    exs = generate(60, seed=0)
    # a record with float / nested extras and a non-ASCII question must survive the round trip
    exs.append(Example("odd/1", "Ünïcode? ✓", "<<1+1=2>>", "-2", "custom", {"w": 0.1, "tags": ["a"]}))
    return exs


def test_round_trip(tmp_path, examples):
    table = random_latents(examples, num_codes=100, seed=3)
    path = write_latents(latents_path(tmp_path, "train"), examples, table)
    assert path == tmp_path / "latents" / "train.jsonl"
    back = read_latents(path, num_codes=100)
    assert dict(back) == dict(table)
    assert list(back) == [ex.id for ex in examples]
    assert back.examples() == examples
    assert back.example("odd/1").extra == {"w": 0.1, "tags": ["a"]}
    first = json.loads(path.read_text().splitlines()[0])
    assert first["n"] == len(first["latents"]) == len(table[examples[0].id])
    assert set(first) == {"id", "latents", "n", "question", "cot", "answer", "source", "extra"}


def test_minimal_records_without_source_fields(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('{"id": "a", "latents": [1, 2]}\n\n{"id": "b", "latents": [3], "n": 1}\n')
    t = read_latents(p)
    assert dict(t) == {"a": (1, 2), "b": (3,)} and t.examples() == []
    with pytest.raises(KeyError, match="no source record"):
        t.example("a")
    with pytest.raises(KeyError, match="no latents for example id 'zz'"):
        t["zz"]


@pytest.mark.parametrize(
    "bad, message",
    [
        ('{"id": "c", "latents": [1, 2', "expected one JSON object per line"),
        ('["c", [1]]', "expected a JSON object"),
        ('{"latents": [1]}', "missing field 'id'"),
        ('{"id": "c"}', "missing field 'latents'"),
        ('{"id": "c", "latents": "1 2"}', "field 'latents' should be list"),
        ('{"id": "c", "latents": [1, 2.5]}', "non-empty list of ints"),
        ('{"id": "c", "latents": [true]}', "non-empty list of ints"),
        ('{"id": "c", "latents": []}', "non-empty list of ints"),
        ('{"id": "c", "latents": [1, 2], "n": 3}', "'n' is 3 but 'latents' has 2"),
        ('{"id": "c", "latents": [1, 200]}', "outside \\[0, num_codes=100\\)"),
        ('{"id": "a", "latents": [1]}', "duplicate id 'a' \\(first on line 1\\)"),
        ('{"id": "c", "latents": [1], "question": "q"}', "missing field 'answer'"),
        ('{"id": "c", "latents": [1], "question": "q", "answer": "1", "extra": 3}', "'extra' should be"),
        ('{"id": "c", "latents": [1, 2, 3], "steps": [1, 1]}', "'steps' \\[1, 1\\] sum to 2 but 'latents' has 3"),
        ('{"id": "c", "latents": [1, 2], "steps": [2, 0]}', "'steps' should be a non-empty list of positive ints"),
        ('{"id": "c", "latents": [1, 2], "steps": []}', "'steps' should be a non-empty list of positive ints"),
        ('{"id": "c", "latents": [1, 2], "steps": 2}', "field 'steps' should be a list of ints"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, bad, message):
    p = tmp_path / "latents.jsonl"
    p.write_text('{"id": "a", "latents": [1]}\n{"id": "b", "latents": [2, 3]}\n' + bad + "\n")
    with pytest.raises(DataFormatError, match=message) as info:
        read_latents(p, num_codes=100)
    assert info.value.line == 3
    assert str(info.value).startswith(f"{p}:3: ")


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="random_latents"):
        read_latents(tmp_path / "nope.jsonl")


def test_random_latents_deterministic_and_order_free(examples):
    a = random_latents(examples, 1000, seed=0)
    b = random_latents(list(reversed(examples)), 1000, seed=0)
    c = random_latents(examples, 1000, seed=1)
    assert all(a[ex.id] == b[ex.id] for ex in examples)
    assert sum(a[ex.id] != c[ex.id] for ex in examples) > len(examples) // 2
    assert len({a[ex.id] for ex in examples}) > len(examples) // 2  # not one sequence for all
    for ex in examples:
        assert len(a[ex.id]) == default_num_latents(ex) == (4 if len(ex.cot) <= 40 else 9)
        assert all(0 <= k < 1000 for k in a[ex.id])
    assert {4, 9} <= {len(v) for v in a.values()}  # the synthetic data has both lengths
    assert sorted(a.lengths().tolist()) == sorted(len(v) for v in a.values())


def test_step_result_latents_hold_each_steps_result(examples):
    chain = Example("c/1", "q", "<<10+9=19>> <<19-3=16>> <<16*6=96>>", "96", "synthetic")
    big = Example("c/2", "q", "<<600*30/100=180>> <<1000+234=1,234>> <<1-3=-2>>", "-2", "gsm8k_aug")
    bare = Example("c/3", "q", "She has 7 left.", "7", "svamp")
    t = step_result_latents([chain, big, *examples], 512)
    assert t["c/1"] == (19, 16, 96)
    # out of range (1234, -2) -> hashed into [0, K), the same way every time; commas are not digits
    assert t["c/2"][0] == 180 and t["c/2"][1] == step_result_code("1234", 512) == step_result_code("1,234", 512)
    assert all(0 <= k < 512 for k in t["c/2"]) and step_result_code("-2", 512) == t["c/2"][2]
    for ex in [e for e in examples if e.source == "synthetic"]:  # one code per step, the last the answer
        assert len(t[ex.id]) == ex.cot.count("<<") and t[ex.id][-1] == int(ex.answer)
    with pytest.raises(ValueError, match="num_codes"):
        step_result_latents([chain], 0)
    with pytest.raises(ValueError, match="'c/3' has no calculator step"):  # never the answer as a code
        step_result_latents([chain, bare], 512)


def test_random_latents_custom_n_and_errors(examples):
    t = random_latents(examples[:5], 7, n_fn=lambda ex: 2)
    assert all(len(v) == 2 and all(0 <= k < 7 for k in v) for v in t.values())
    with pytest.raises(ValueError, match="n_fn returned 0"):
        random_latents(examples[:2], 7, n_fn=lambda ex: 0)
    with pytest.raises(ValueError, match="num_codes"):
        random_latents(examples[:2], 0)


def test_table_validation(examples):
    with pytest.raises(ValueError, match="outside \\[0, 10\\)"):
        LatentTable({"a": [3, 10]}, num_codes=10)
    with pytest.raises(ValueError, match="examples without latents"):
        LatentTable({"a": [1]}, examples={"b": examples[0]})
    t = LatentTable({"a": [1], "b": [2, 3]})
    assert t.missing([Example("a", "q", "", "1", "s"), Example("z", "q", "", "1", "s")]) == ["z"]
    assert "2 ids" in repr(t)


def test_steps_round_trip_and_default_to_one_step(tmp_path, examples):
    table = random_latents(examples[:3], num_codes=100, seed=3)
    steps = {examples[0].id: [1] * len(table[examples[0].id]), examples[1].id: [len(table[examples[1].id]) - 1, 1]}
    path = write_latents(tmp_path / "s.jsonl", examples[:3], table, steps)
    back = read_latents(path, num_codes=100)
    assert dict(back) == dict(table)
    assert back.step_counts(examples[0].id) == tuple(steps[examples[0].id])
    assert back.step_counts(examples[1].id) == tuple(steps[examples[1].id])
    assert back.step_counts(examples[2].id) == (len(table[examples[2].id]),)  # no "steps": one step of n codes
    assert "steps" not in json.loads(path.read_text().splitlines()[2])
    with pytest.raises(KeyError, match="no latents for example id 'zz'"):
        back.step_counts("zz")
    with pytest.raises(ValueError, match="sum to 1 but 'latents' has 2"):
        write_latents(tmp_path / "t.jsonl", examples[:1], {examples[0].id: [1, 2]}, {examples[0].id: [1]})
    with pytest.raises(ValueError, match="example 'a': 'steps' \\[3\\] sum to 3 but 'latents' has 2"):
        LatentTable({"a": [1, 2]}, steps={"a": [3]})
    with pytest.raises(ValueError, match="step counts for an example without latents"):
        LatentTable({"a": [1, 2]}, steps={"b": [2]})


def test_step_result_latents_are_one_step_a_code_where_the_cot_steps_pair_up():
    from dlr_jax.data.curriculum import split_cot, step_counts
    from dlr_jax.data.synthetic import SyntheticConfig

    chain = Example("c/1", "q", "<<10+9=19>> <<19-3=16>> <<16*6=96>>", "96", "synthetic")
    # a natural chain whose sentences are its calculator steps one to one pairs up too
    paired = Example("c/2", "q", "He has 10 + 9 = <<10+9=19>>19. Then 19 - 3 = <<19-3=16>>16.", "16", "gsm8k")
    # the synthetic natural style ends on a sentence without a calculator step: 4 text steps, 3 codes
    natural = generate(2, seed=0, config=SyntheticConfig(cot_style="natural"))[1]
    t = step_result_latents([chain, paired, natural], 512)
    assert t.step_counts("c/1") == (1, 1, 1) and t.step_counts("c/2") == (1, 1)
    assert len(split_steps(natural.cot)) == 4 and t.step_counts(natural.id) == (3,)  # one step of its 3 codes
    # the curriculum cuts each CoT where its codes are cut: code i with the text step that holds result i
    assert split_cot(chain.cot, len(step_counts(t, "c/1")), 1) == ("<<10+9=19>>", "<<19-3=16>> <<16*6=96>>")
    assert split_cot(paired.cot, 2, 1)[0].endswith("<<10+9=19>>19.")
    synth = generate(30, seed=1)  # the synthetic default style: equations, S = its calculator steps
    s = step_result_latents(synth, 512)
    assert [s.step_counts(ex.id) for ex in synth] == [(1,) * len(split_steps(ex.cot)) for ex in synth]
    assert {len(s.step_counts(ex.id)) for ex in synth} >= {1, 2}
