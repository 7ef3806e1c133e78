import json

import pytest

from dlr_jax.config import ConfigError
from dlr_jax.data import protocol
from dlr_jax.data.records import Example


def _examples(n: int) -> list[Example]:
    return [Example(id=f"ex/{i}", question=f"q{i}", cot="x " * (i % 7), answer=str(i), source="t") for i in range(n)]


def test_split_is_disjoint_complete_and_independent_of_order():
    exs = _examples(100)
    parts = protocol.split_sft_rl(exs, 25, seed=3)
    assert len(parts["rl"]) == 25 and len(parts["sft"]) == 75
    assert {e.id for e in parts["rl"]}.isdisjoint({e.id for e in parts["sft"]})
    assert {e.id for e in parts["rl"]} | {e.id for e in parts["sft"]} == {e.id for e in exs}
    shuffled = protocol.split_sft_rl(exs[::-1], 25, seed=3)
    assert {e.id for e in shuffled["rl"]} == {e.id for e in parts["rl"]}
    assert [e.id for e in parts["sft"]] == [e.id for e in exs if e.id not in {x.id for x in parts["rl"]}]
    other = protocol.split_sft_rl(exs, 25, seed=4)
    assert {e.id for e in other["rl"]} != {e.id for e in parts["rl"]}
    # a fraction means the same as its count
    assert {e.id for e in protocol.split_sft_rl(exs, 0.25, seed=3)["rl"]} == {e.id for e in parts["rl"]}


def test_no_split_gives_every_stage_every_example():
    exs = _examples(10)
    parts = protocol.split_sft_rl(exs, 0)
    assert parts["sft"] == exs and parts["rl"] == exs


@pytest.mark.parametrize("bad", [-1, 10, 12, 2.5])
def test_bad_split_sizes_are_errors(bad):
    # ConfigErrors: `train` prints them as one line (exit 2)
    with pytest.raises(ConfigError, match="rl_split"):
        protocol.split_sft_rl(_examples(10), bad)


def test_a_count_for_the_full_file_on_a_subset_names_the_download():
    """The paper recipe's 85,620 RL examples on GSM8K-Aug's 3,000-line subset (the full file not downloaded)."""
    with pytest.raises(ConfigError, match="85620 of 3000 .*`python -m dlr_jax.data.download gsm8k_aug_full`"):
        protocol.rl_count(3000, 85620)
    with pytest.raises(ConfigError) as e:  # an RL part that leaves SFT nothing, for other reasons: no download hint
        protocol.rl_count(10, 0.99)
    assert "download" not in str(e.value)


def test_cot_length_filter_counts_what_it_drops():
    exs = _examples(14)
    kept, dropped = protocol.cot_length_filter(exs, lambda t: len(t.split()), 3)
    assert dropped == sum(1 for i in range(14) if i % 7 > 3) and len(kept) + dropped == 14
    assert all(len(e.cot.split()) <= 3 for e in kept)
    assert protocol.cot_length_filter(exs, len, 0) == (exs, 0)


def test_steps_for_epochs_rounds_up():
    assert protocol.steps_for_epochs(3, 300_000, 64) == 14_063
    assert protocol.steps_for_epochs(1, 10, 64) == 1
    with pytest.raises(ValueError):
        protocol.steps_for_epochs(0, 10, 64)


def test_record_refuses_a_different_split(tmp_path):
    info = {"rl_examples": 3, "rl_ids_sha256": protocol.ids_digest(_examples(3))}
    f = protocol.record(tmp_path, info)
    assert json.loads(f.read_text()) == info
    protocol.record(tmp_path, dict(info))  # same protocol: fine
    with pytest.raises(ValueError, match=r"differs from the recorded one in \['rl_examples'\]"):
        protocol.record(tmp_path, {**info, "rl_examples": 4})


def test_processes_other_than_0_check_the_recorded_split_but_never_write_it(tmp_path):
    info = {"examples": 10, "sft_ids_sha256": "ab"}
    protocol.record(tmp_path, info, write=False)
    assert not (tmp_path / protocol.PROTOCOL_FILE).exists()
    protocol.record(tmp_path, info)
    protocol.record(tmp_path, info, write=False)
    with pytest.raises(ValueError, match=r"differs from the recorded one in \['examples'\]"):
        protocol.record(tmp_path, {**info, "examples": 11}, write=False)
