import json

import pytest

from dlr_jax.data.records import (
    NUMBER,
    DataFormatError,
    Example,
    RawFloat,
    clean_number_text,
    iter_jsonl,
    number_text,
    read_json_array,
    require,
)


@pytest.mark.parametrize(
    "raw, clean",
    [
        ("1,080", "1080"),
        ("-2,520,000", "-2520000"),
        ("36.", "36"),
        ("51.0", "51"),
        ("-9867630.0", "-9867630"),
        ("3244047.0999999996", "3244047.0999999996"),
        ("2/5", "2/5"),
        ("0.5", "0.5"),
        (" 7 ", "7"),
        ("1,2", "1,2"),  # not a thousands grouping: left for the scorer
    ],
)
def test_clean_number_text(raw, clean):
    assert clean_number_text(raw) == clean


def test_raw_floats_keep_source_digits(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('{"t": 3244047.0999999996, "s": "3.5", "i": 4}\n')
    [(line, obj)] = list(iter_jsonl(p))
    assert line == 1
    assert isinstance(obj["t"], RawFloat) and obj["t"] == "3244047.0999999996"
    assert number_text(obj["t"]) == "3244047.0999999996"
    # a JSON string that looks like a number is not a number
    with pytest.raises(DataFormatError, match="'s' should be int/number"):
        require(obj, "s", NUMBER, p, line=1)
    assert require(obj, "i", NUMBER, p, line=1) == 4


def test_bool_is_not_a_number(tmp_path):
    with pytest.raises(DataFormatError, match="should be int/number, got bool"):
        require({"a": True}, "a", NUMBER, tmp_path / "f", index=3)


def test_error_names_file_and_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"a": 1}\n\n{"a": 2,\n')
    with pytest.raises(DataFormatError) as ei:
        list(iter_jsonl(p))
    assert ei.value.line == 3 and ei.value.path == str(p)
    assert str(ei.value).startswith(f"{p}:3: expected one JSON object per line")


def test_non_object_line(tmp_path):
    p = tmp_path / "arr.jsonl"
    p.write_text("[1, 2]\n")
    with pytest.raises(DataFormatError, match=r"arr.jsonl:1: expected a JSON object, got list"):
        list(iter_jsonl(p))


def test_json_array_errors(tmp_path):
    p = tmp_path / "obj.json"
    p.write_text('{"a": 1}')
    with pytest.raises(DataFormatError, match="top-level JSON array, got dict"):
        read_json_array(p)
    p.write_text("[1,\n 2,,]")
    with pytest.raises(DataFormatError) as ei:
        read_json_array(p)
    assert ei.value.line == 2


def test_bytes_that_are_not_utf8_name_file_line_and_column(tmp_path):
    # A Latin-1 export, say: the error points at the byte, where Python's own names an offset into a read buffer.
    p = tmp_path / "latin1.jsonl"
    p.write_bytes(b'{"q": "a"}\n{"q": "caf\xe9"}\n')
    with pytest.raises(DataFormatError) as ei:
        list(iter_jsonl(p))
    assert ei.value.line == 2
    assert str(ei.value) == f"{p}:2: not valid UTF-8 (byte 0xe9 at column 11); save the file as UTF-8"
    arr = tmp_path / "latin1.json"
    arr.write_bytes(b'[\n {"q": "a"},\n {"q": "caf\xe9"}]\n')
    with pytest.raises(DataFormatError, match=r"latin1.json:3: not valid UTF-8 \(byte 0xe9 at column 12\)"):
        read_json_array(arr)


def test_a_utf8_byte_order_mark_is_read_past(tmp_path):
    p = tmp_path / "bom.jsonl"
    p.write_bytes(b'\xef\xbb\xbf{"q": 1}\n{"q": 2}\n')
    assert [obj["q"] for _, obj in iter_jsonl(p)] == [1, 2]
    arr = tmp_path / "bom.json"
    arr.write_bytes(b'\xef\xbb\xbf[{"q": 1}]')
    assert read_json_array(arr) == [{"q": 1}]


def test_json_error_names_the_column_once(tmp_path):
    p = tmp_path / "cut.jsonl"
    p.write_text('{"q": "cut\n')
    with pytest.raises(DataFormatError) as ei:
        list(iter_jsonl(p))
    assert "(Unterminated string starting at: column 7)" in str(ei.value)


def test_missing_field_message(tmp_path):
    with pytest.raises(DataFormatError) as ei:
        require({"b": 1}, "a", str, tmp_path / "f.json", index=7)
    assert ei.value.index == 7
    assert "[item 7, 0-based]: missing field 'a' (fields present: ['b'])" in str(ei.value)


def test_example_dict_round_trip():
    ex = Example("i", "q", "<<1+2=3>>", "3", "s", {"k": [1, 2]})
    again = Example.from_dict(json.loads(json.dumps(ex.to_dict())))
    assert again == ex
    assert hash(again) == hash(ex)  # extra is excluded from the hash, so dict extras stay hashable
