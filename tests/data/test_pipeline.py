import itertools
import json
from collections import Counter

import numpy as np
import pytest

from dlr_jax.data import formats
from dlr_jax.data.eval_prompts import make_eval_batches
from dlr_jax.data.items import Item, build_sequence
from dlr_jax.data.pipeline import BATCH_KEYS, ROW_MULTIPLE, make_stage_dataset, row_width

MAX_LEN, B = 96, 4  # fixtures examples, tok, table: conftest.py


def _expected(stage, tok, examples, table, max_len=MAX_LEN):
    """Counter of (tokens, loss_mask) tuples of every example that fits max_len."""
    out = Counter()
    for ex in examples:
        codes = tuple(table[ex.id]) if stage != "textsft" else ()
        seq = build_sequence(stage, tok, Item(ex, codes))
        if len(seq) <= max_len:
            out[(tuple(seq.tokens.tolist()), tuple(seq.loss_mask.tolist()))] += 1
    return out


def _segments(batches):
    """Counter of (tokens, loss_mask) per segment, checking segment ids, positions and padding."""
    out = Counter()
    for b in batches:
        for row in range(b["tokens"].shape[0]):
            seg, pos = b["segment_ids"][row], b["positions"][row]
            pad = seg == 0
            assert (b["loss_mask"][row][pad] == 0).all() and (pos[pad] == 0).all()
            ids = [int(s) for s in seg[~pad]]
            assert ids == sorted(ids) and sorted(set(ids)) == list(range(1, max(ids) + 1))
            assert not pad[: len(ids)].any()  # segments first, padding after
            for s in set(ids):
                m = seg == s
                np.testing.assert_array_equal(pos[m], np.arange(m.sum()))
                out[(tuple(b["tokens"][row][m].tolist()), tuple(b["loss_mask"][row][m].tolist()))] += 1
    return out


def _ds(stage, examples, tok, **kw):
    """make_stage_dataset with this file's defaults (one process, seed 0)."""
    kw = {"batch_size": B, "max_len": MAX_LEN, "seed": 0, "shard_index": 0, "shard_count": 1, **kw}
    return make_stage_dataset(stage, examples, tok, **kw)


def _take(ds, n):
    return list(itertools.islice(iter(ds), n))


def _same(a, b):
    return len(a) == len(b) and all(np.array_equal(x[k], y[k]) for x, y in zip(a, b, strict=True) for k in BATCH_KEYS)


@pytest.mark.parametrize("stage", ["textsft", "align", "sft"])
@pytest.mark.parametrize("pack", [False, True])
def test_one_epoch_covers_every_sequence_once(stage, pack, tok, examples, table):
    max_len = 3 * MAX_LEN if pack else MAX_LEN  # room for several sequences per packed row
    ds = _ds(stage, examples, tok, max_len=max_len, latents=table, pack=pack, num_epochs=1, drop_remainder=False)
    batches = list(ds)
    for b in batches[:-1]:
        assert set(b) == set(BATCH_KEYS)
        for k in BATCH_KEYS:
            assert b[k].shape == (B, max_len) and b[k].dtype == np.int32
    for b in batches:
        assert (b["tokens"][b["segment_ids"] == 0] == tok.pad_id).all()
    if not pack:
        assert all((b["segment_ids"] <= 1).all() for b in batches)
    expected = _expected(stage, tok, examples, table, max_len)
    assert _segments(batches) == expected
    n_rows = sum(b["tokens"].shape[0] for b in batches)
    if pack:
        assert n_rows < sum(expected.values()) / 2  # every sequence is < max_len / 3: rows are shared
        assert max(int(b["segment_ids"].max()) for b in batches) >= 3
    else:
        assert n_rows == sum(expected.values())


def test_row_width():
    assert row_width([5, 17, 9], 96, "max_len") == 96
    assert row_width([5, 17, 9], 96, "longest") == 32  # 17 rounded up to a multiple of 16
    assert row_width([16], 96, "longest") == 16
    assert row_width([90], 95, "longest") == 95  # never past max_len
    with pytest.raises(ValueError, match="pad_to must be longest or max_len"):
        row_width([5], 96, "shortest")


@pytest.mark.parametrize("stage", ["textsft", "align", "sft"])
def test_longest_rows_hold_the_max_len_rows_without_their_trailing_padding(stage, tok, examples, table):
    """pad_to="longest": one width for the whole stage (the longest kept example, rounded up), the same rows in
    the same order as max_len-wide ones, cut where only padding was."""
    kw = {"latents": table, "num_epochs": 1, "drop_remainder": False, "max_len": 3 * MAX_LEN}
    full, trim = list(_ds(stage, examples, tok, **kw)), list(_ds(stage, examples, tok, pad_to="longest", **kw))
    longest = max(len(build_sequence(stage, tok, Item(ex, tuple(table[ex.id]) if stage != "textsft" else ())))
                  for ex in examples)
    assert longest <= 3 * MAX_LEN - ROW_MULTIPLE  # every example fits, with room to trim
    width = -(-longest // ROW_MULTIPLE) * ROW_MULTIPLE
    assert {b["tokens"].shape[1] for b in trim} == {width}
    for f, t in zip(full, trim, strict=True):
        for k in BATCH_KEYS:
            np.testing.assert_array_equal(f[k][:, :width], t[k])
            assert (f[k][:, width:] == (tok.pad_id if k == "tokens" else 0)).all()


@pytest.mark.parametrize("pack", [False, True])
def test_seeded_order(tok, examples, pack):
    def first(seed):
        ds = _ds("textsft", examples, tok, seed=seed, pack=pack)
        return _take(ds, 5)

    a, b, c = first(0), first(0), first(1)
    assert _same(a, b)
    assert not _same(a, c)


def test_epochs_are_reshuffled(tok, examples):
    ds = _ds("textsft", examples, tok, batch_size=1, num_epochs=2)
    rows = [tuple(b["tokens"][0].tolist()) for b in ds]
    n = len(rows) // 2
    assert len(rows) == 2 * n and Counter(rows[:n]) == Counter(rows[n:])
    assert len(set(rows[:n])) == n and rows[:n] != rows[n:]


def test_shards_are_disjoint_halves(tok, examples, table):
    def rows(i):
        ds = _ds("align", examples, tok, batch_size=1, latents=table, shard_index=i, shard_count=2, num_epochs=1)
        return [tuple(b["tokens"][0].tolist()) for b in ds]

    r0, r1 = rows(0), rows(1)
    assert not set(r0) & set(r1)
    assert abs(len(r0) - len(r1)) <= 1
    full = _ds("align", examples, tok, batch_size=1, latents=table, num_epochs=1)
    assert Counter(r0) + Counter(r1) == Counter(tuple(b["tokens"][0].tolist()) for b in full)


@pytest.mark.parametrize("pack", [False, True, "examples"])
def test_checkpoint_resume(tok, examples, table, pack):
    def make():  # "examples": packed, batch_size counting examples (data.pack_batch=examples)
        how = {"pack": True, "pack_batch": "examples", "batch_size": 3 * B} if pack == "examples" else {"pack": pack}
        return _ds("sft", examples, tok, seed=5, latents=table, **how)

    it = iter(make())
    # far enough that the saved state lies past the first epoch boundary
    head = [next(it) for _ in range(23)]
    state = json.loads(json.dumps(it.get_state()))  # the trainer stores it as JSON
    tail = [next(it) for _ in range(12)]
    fresh = iter(make())
    fresh.set_state(state)
    assert _same([next(fresh) for _ in range(12)], tail)
    assert not _same(head[-12:], tail)


def test_resuming_with_another_batch_size_says_how_to_back_out(tok, examples):
    """The workdir's config.yaml already holds the new batch size when the data position is restored, so
    the message names the flag that going back needs (a review found the plain error a trap)."""
    from dlr_jax.config import ConfigError

    it = iter(_ds("textsft", examples, tok, batch_size=B))
    next(it)
    state = json.loads(json.dumps(it.get_state()))
    other = iter(_ds("textsft", examples, tok, batch_size=B + 1))
    with pytest.raises(ConfigError, match=rf"counts batches of {B} .*this run's are {B + 1}: a stage resumes with the "
                                          r"batch size it started with. Rerun with that batch size and --set "
                                          r"run.allow_config_change=true"):
        other.set_state(state)


def test_resuming_packed_examples_on_other_rows_names_what_sets_them(tok, examples, table):
    """Under data.pack_batch=examples the rows a step takes follow grad_accum and the data-parallel devices, so a
    resume on another mesh gets other rows: the message says so, not "rerun with that batch size" (a review)."""
    from dlr_jax.config import ConfigError

    def make(multiple):
        return _ds("sft", examples, tok, seed=5, latents=table, pack=True, pack_batch="examples", batch_size=3 * B,
                   row_multiple=multiple)

    first, other = make(1), make(4)
    assert first.global_batch != other.global_batch
    it = iter(first)
    next(it)
    state = json.loads(json.dumps(it.get_state()))
    said = r"packed rows.*grad_accum and the data-parallel devices.*Resume with the mesh"
    with pytest.raises(ConfigError, match=said):
        iter(other).set_state(state)


def test_worker_processes_match_in_process(tok, examples):
    local = list(_ds("textsft", examples, tok, num_epochs=1))
    it = iter(_ds("textsft", examples, tok, num_epochs=1, num_workers=2))
    head = [next(it) for _ in range(3)]
    state = it.get_state()
    rest = list(it)
    assert _same(head + rest, local)
    again = iter(_ds("textsft", examples, tok, num_epochs=1, num_workers=2))
    again.set_state(state)
    assert _same(list(again), rest)


def test_errors(tok, examples, table):
    # shard_index / shard_count left to their defaults (jax.process_index() / process_count())
    with pytest.raises(ValueError, match="unknown stage 'rl'"):
        make_stage_dataset("rl", examples, tok, batch_size=B, max_len=MAX_LEN, seed=0)
    with pytest.raises(ValueError, match="needs latents"):
        make_stage_dataset("align", examples, tok, batch_size=B, max_len=MAX_LEN, seed=0)
    partial = {ex.id: table[ex.id] for ex in examples[:-3]}
    with pytest.raises(KeyError, match=f"3 of {len(examples)} examples have no latents"):
        make_stage_dataset("sft", examples, tok, batch_size=B, max_len=MAX_LEN, seed=0, latents=partial)
    with pytest.raises(ValueError, match="shard 0/1 is empty"):
        _ds("textsft", examples, tok, max_len=3)
    with pytest.raises(ValueError, match="shard_index"):
        _ds("textsft", examples, tok, shard_index=2, shard_count=2)


def test_eval_batches(tok, examples):
    batches = make_eval_batches(examples, tok, batch_size=16)
    assert [len(b.indices) for b in batches] == [16] * (len(examples) // 16) + (
        [len(examples) % 16] if len(examples) % 16 else []
    )
    order = [i for b in batches for i in b.indices]
    assert sorted(order) == list(range(len(examples)))
    lens = [len(p) for b in batches for p in b.prompts]
    assert lens == sorted(lens, reverse=True) and lens[0] > lens[-1]
    for indices, prompts in batches:
        for i, p in zip(indices, prompts, strict=True):
            assert p == formats.prompt_ids(tok, examples[i].question)
    assert batches[0].max_len == lens[0]


def test_out_of_range_token_id_is_one_clear_error_before_any_batch(examples, tok):
    from dlr_jax.data.items import TokenRangeError

    # A model table too small for ids the tokenizer produces, as when a Llama-3 embedding is not grown for
    # the added pad / boundary tokens. JAX would return NaN for these ids instead of failing.
    rows = int(build_sequence("textsft", tok, Item(examples[0], ())).tokens.max())
    with pytest.raises(TokenRangeError, match=rf"example '{examples[0].id}': token id \d+ is outside the "
                       rf"embedding table of {rows} rows"):
        make_stage_dataset("textsft", examples, tok, batch_size=B, max_len=MAX_LEN, seed=0, vocab_size=rows)
    ds = make_stage_dataset("textsft", examples, tok, batch_size=B, max_len=MAX_LEN, seed=0,
                            vocab_size=tok.text_vocab_size)
    assert next(iter(ds))["tokens"].max() < tok.text_vocab_size


def _global_batches(stage, examples, tok, table, procs, n, *, state=None, pack=False):
    """n global batches of 2 * B rows as `procs` processes would read them (rows concatenated in
    process order), plus the process-0 iterator state after them."""
    its = []
    for p in range(procs):
        it = iter(_ds(stage, examples, tok, seed=3, latents=table, batch_size=2 * B // procs, shard_index=p,
                      shard_count=procs, pack=pack))
        if state is not None:
            it.set_state(json.loads(json.dumps(state)))
        its.append(it)
    out = []
    for _ in range(n):
        parts = [next(it) for it in its]
        out.append({k: np.concatenate([b[k] for b in parts]) for k in BATCH_KEYS})
    return out, its[0].get_state()


def test_global_batches_do_not_depend_on_the_number_of_processes(tok, examples, table):
    # past an epoch boundary (len(examples) / (2 B) batches per epoch)
    n = len(examples) // (2 * B) + 3
    one, _ = _global_batches("sft", examples, tok, table, 1, n)
    two, _ = _global_batches("sft", examples, tok, table, 2, n)
    four, _ = _global_batches("sft", examples, tok, table, 4, n)
    assert _same(one, two) and _same(one, four)
    # the control: each process shuffling its own shard (the old pipeline) gives other batches
    old = [b["tokens"] for b in _take(_ds("sft", examples[0::2], tok, seed=3, latents=table), 2)]
    assert not np.array_equal(old[0], one[0]["tokens"][:B])


def test_state_from_one_process_resumes_on_two_with_the_same_next_batch(tok, examples, table):
    head, state = _global_batches("sft", examples, tok, table, 1, 7)
    assert state["global_batches"] == 7
    want, _ = _global_batches("sft", examples, tok, table, 1, 10)
    resumed, after = _global_batches("sft", examples, tok, table, 2, 3, state=state)
    assert _same(resumed, want[7:]) and after["global_batches"] == 10
    back, _ = _global_batches("sft", examples, tok, table, 1, 1, state=after)  # and from 2 back to 1
    assert _same(back, _global_batches("sft", examples, tok, table, 1, 11)[0][10:])


def test_packed_state_refuses_another_process_count(tok, examples, table):
    _, state = _global_batches("sft", examples, tok, table, 1, 2, pack=True)
    with pytest.raises(ValueError, match="cannot resume on 2"):
        _global_batches("sft", examples, tok, table, 2, 1, state=state, pack=True)
