"""JSON lines decoding: orjson (when installed) and the stdlib give the same records, the same bad
records at the same places, and the same resume states.

Every test runs twice through the ``parser`` fixture: with orjson (a spy around ``orjson.loads``
shows it was used) and with the stdlib path forced. The expected records come from ``json.loads``
on each non-blank line, computed here independently of the reader.
"""

from __future__ import annotations

import json
import random
import warnings
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

import pytest
from file_fixtures import jsonl_records
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from subprocess_helpers import run_python

import datapipes as dp
from nodes import Context
from nodes.readers import JsonLinesFormat
from nodes.readers import jsonl as jsonl_module

BLOCK_SIZES = [1 << 16, 256, 61]


@dataclass
class Parser:
    name: str
    calls: list[int] = field(default_factory=list)  # lengths of the inputs orjson parsed


@pytest.fixture(params=["orjson", "stdlib"])
def parser(request, monkeypatch) -> Parser:
    chosen = Parser(request.param)
    if request.param == "orjson":
        orjson = pytest.importorskip("orjson")

        def spy(data: bytes) -> Any:
            chosen.calls.append(len(data))
            return orjson.loads(data)

        monkeypatch.setattr(jsonl_module, "_orjson_loads", spy)
    else:
        monkeypatch.setattr(jsonl_module, "_orjson_loads", None)
    return chosen


# ----- data --------------------------------------------------------------------------------


def canonical(values: list[Any]) -> list[str]:
    """Type-exact text of values: 1, 1.0 and True differ, NaN and -0.0 compare, keys keep order."""
    return [json.dumps(v) for v in values]


def expected_records(data: bytes) -> list[Any]:
    """``json.loads`` of every line that is not blank (``bytes.strip`` whitespace)."""
    return [json.loads(line.decode()) for line in data.split(b"\n") if line.strip()]


CORNER_LINES = [
    '{"id": 1, "text": "plain"}',
    '{"unicode": "béta γάμμα дельта 日本語 emoji 🎉", "raw": "\u2028\u2029\x7f"}',
    r'{"escaped": "\u00e9\ud83c\udf89\n\t\"\\\/\b\f\r\u0000"}',
    '{"nested": {"a": [1, [2, [3, {"b": null}]]], "t": true, "f": false, "e": [], "o": {}}}',
    '{"deep": ' + "[" * 60 + "]" * 60 + "}",
    '""',
    "0",
    "-0",
    "-0.0",
    "1.5e-7",
    "1E+5",
    "null",
    "true",
    "[0.1, 0.30000000000000004, 5e-324, 1.7976931348623157e308, 9007199254740993.0]",
    "0.1234567890123456789012345",  # a long digit run in a fraction
    "9223372036854775807",
    "1234567890123456789",  # a 19-digit id (fits 64 bits)
    "18446744073709551615",  # 2**64 - 1
    "18446744073709551616",  # 2**64: orjson would make it a float
    "-9223372036854775808",  # -2**63
    "-9223372036854775809",  # -2**63 - 1: orjson would make it a float
    '{"id": 123456789012345678901234567890, "neg": -99999999999999999999}',
    "[1e400, -1e400, 1e-400]",  # json.loads: inf, -inf, 0.0 (orjson rejects the first two)
    "NaN",
    "[Infinity, -Infinity]",
    r'{"lone": "\ud800", "low": "\udc00x", "pair": "\ud800\u0041"}',  # lone surrogates
    '{"dup": 1, "other": 2, "dup": 3}',
    '   {"padded": 1}\t ',
    '"' + "x" * 700 + '"',  # longer than the small blocks
]


def corpus(seed: int) -> tuple[bytes, list[Any]]:
    """Corner lines and generated records, shuffled, with \\n or \\r\\n endings, blank lines
    between some, and a last line without a line break."""
    rng = random.Random(seed)
    texts = CORNER_LINES + [json.dumps(r, ensure_ascii=False) for r in jsonl_records(60, seed)]
    texts += [json.dumps([rng.uniform(-1e9, 1e9), rng.getrandbits(70) >> rng.randrange(70)])]
    rng.shuffle(texts)
    parts = []
    for i, text in enumerate(texts):
        parts.append(text + ("\r\n" if i % 3 == 0 else "\n"))
        if i % 11 == 5:
            parts.append(rng.choice(["\n", "\r\n", "  \t\n", " \r\n"]))
    parts.append('{"last": "no line break"}')
    data = "".join(parts).encode("utf-8")
    return data, expected_records(data)


def write(tmp_path: Path, name: str, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def read_node(url: str, block_size: int, on_error: str = "raise") -> Any:
    pipe = dp.files(url).read_jsonl(block_size=block_size, on_error=on_error)
    node = pipe.build(Context())
    node.reset(None)
    return node


# ----- the same records ----------------------------------------------------------------------


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_corpus_decodes_like_json_loads(tmp_path, parser, block_size):
    data, expected = corpus(seed=block_size)
    url = write(tmp_path, "corpus.jsonl", data)
    got = list(read_node(url, block_size))
    assert canonical(got) == canonical(expected)
    assert any(isinstance(v, int) and v >= 2**64 for v in got)  # exact, not a float
    if parser.name == "orjson" and block_size < 1000:
        assert parser.calls  # blocks without long integers took the orjson path


def test_plain_records_parse_each_line_once_with_orjson(tmp_path, parser):
    records = [
        {**r, "snowflake": 1_234_567_890_123_456_789 + i}
        for i, r in enumerate(jsonl_records(300, seed=4))
    ]
    data = "".join(json.dumps(r) + "\n" for r in records).encode()
    url = write(tmp_path, "plain.jsonl", data)
    got = list(read_node(url, 4096))
    assert canonical(got) == canonical(records)
    if parser.name == "orjson":
        # one orjson call per line, no block parsed twice (19-digit ids stay on this path)
        assert sorted(parser.calls) == sorted(len(line) for line in data.splitlines())


INTEGERS_NEAR_64_BITS = [
    v
    for k in (18, 19, 20, 21)
    for base in (10 ** (k - 1), 10**k - 1, 2**63, 2**64)
    for v in (base - 1, base, base + 1, -base + 1, -base, -base - 1)
]


@pytest.mark.parametrize("padding", [0, 9000])  # small chunks are scanned without numpy
def test_integers_near_64_bits_stay_exact(parser, padding):
    fmt = JsonLinesFormat()
    for n in INTEGERS_NEAR_64_BITS:
        chunk = f'"{"x" * padding}"\n{{"n": {n}, "l": [{n}]}}\n{n}\n'.encode()
        got = fmt.decode_records(chunk, None)
        assert canonical(got) == canonical(expected_records(chunk)), n
        assert type(got[-1]) is int


def test_a_given_loads_is_honoured(parser):
    def tagged(text: str) -> Any:
        return ["loads", json.loads(text)]

    fmt = JsonLinesFormat(loads=tagged)
    assert fmt.decode_records(b'{"a": 1}\n2\r\n', None) == [["loads", {"a": 1}], ["loads", 2]]
    assert parser.calls == []


WITHOUT_ORJSON = """
import json, sys
sys.modules["orjson"] = None  # importing it fails, as where it is not installed
import datapipes as dp
from nodes.readers import jsonl
assert jsonl._orjson_loads is None
pipe = dp.files(sys.argv[1]).read_jsonl(block_size=256, on_error="skip")
print(json.dumps(list(dp.Loader(pipe))))
"""


@pytest.mark.slow
def test_reads_without_orjson_installed(tmp_path):
    data, expected = corpus(seed=3)
    url = write(tmp_path, "corpus.jsonl", data + b"\n{bad\n")
    assert canonical(json.loads(run_python(WITHOUT_ORJSON, url))) == canonical(expected)


# ----- bad records ---------------------------------------------------------------------------

# Lines that are not one JSON value each, though joined into one array they could parse.
BAD_CASES = {
    "comma": ["1,2"],
    "two-values": ["1 2"],
    "two-objects": ['{"a":1}{"b":2}'],
    "array-over-two-lines": ["[1", "2]", "3,4"],
    "object-over-two-lines": ['{"a":1', '"b":2}', "1,2"],
    "wrapped-join": ["1],[2", "[[3", "4]]"],
    "arrays-with-comma": ["[1],[2]", "[1], [2]"],
    "truncated": ['{"j": 3, "broken": '],
    "nan-then-bad": ["NaN", "nul"],
    "bad-utf-8": ['"\udcff"'],  # written with surrogateescape: the raw byte 0xFF
    # not JSON whitespace, and not blank either (a blank line is only b" \t\r\x0b\x0c")
    "form-feed": ["\x0c1"],
    "vertical-tab": ["2\x0b"],
    "no-break-space": ["\xa03"],
}


def bad_file(tmp_path: Path, case: str) -> tuple[str, bytes]:
    lines = ['{"i": 0}', "[1, 2]", *BAD_CASES[case], '{"i": 9}', "", '"end"']
    data = "\n".join(lines).encode("utf-8", "surrogateescape") + b"\n"
    return write(tmp_path, f"{case}.jsonl", data), data


def expected_places(data: bytes) -> tuple[list[tuple[int, Any]], list[tuple[int, int, str]]]:
    """(line number, record) of each good line, (line number, byte offset, error) of each bad."""
    good, bad, offset = [], [], 0
    for number, line in enumerate(data.split(b"\n")[:-1], 1):
        if line.strip():
            try:
                good.append((number, json.loads(line.decode())))
            except json.JSONDecodeError as error:
                bad.append((number, offset, f"{error.msg} (column {error.colno})"))
            except UnicodeDecodeError as error:
                bad.append((number, offset, str(error)))
        offset += len(line) + 1
    return good, bad


@pytest.mark.parametrize("block_size", [1 << 16, 16])
@pytest.mark.parametrize("case", list(BAD_CASES))
def test_bad_lines_raise_at_their_place(tmp_path, parser, case, block_size):
    url, data = bad_file(tmp_path, case)
    good, bad = expected_places(data)
    line, offset, reason = bad[0]
    before = [record for number, record in good if number < line]
    node = read_node(url, block_size)
    got = list(islice(node, len(before)))
    with pytest.raises(dp.BadRecordError) as caught:
        next(node)
    assert canonical(got) == canonical(before)
    assert caught.value.url == url
    assert caught.value.where == f"line {line} (byte offset {offset})"
    assert reason in caught.value.reason


@pytest.mark.parametrize("block_size", [1 << 16, 16])
@pytest.mark.parametrize("case", list(BAD_CASES))
def test_bad_lines_skipped_and_counted(tmp_path, parser, case, block_size):
    url, data = bad_file(tmp_path, case)
    good, bad = expected_places(data)
    node = read_node(url, block_size, on_error="skip")
    with pytest.warns(dp.BadRecordWarning, match=f"line {bad[0][0]} "):
        got = list(node)
    assert canonical(got) == canonical([record for _, record in good])
    assert node.state_dict()["skipped"] == len(bad)


def test_a_line_too_deep_for_the_stdlib_is_a_bad_record(tmp_path, monkeypatch):
    monkeypatch.setattr(jsonl_module, "_orjson_loads", None)
    deep = "[" * 100_000 + "]" * 100_000
    url = write(tmp_path, "deep.jsonl", f'{{"a": 1}}\n{deep}\n{{"b": 2}}\n'.encode())
    node = read_node(url, 1 << 16, on_error="skip")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = list(node)
    assert got == [{"a": 1}, {"b": 2}] and node.state_dict()["skipped"] == 1
    assert "line 2 " in str(caught[0].message)


# ----- resume --------------------------------------------------------------------------------


def states_and_records(url: str, block_size: int, stops: list[int]) -> tuple[list, list]:
    node = read_node(url, block_size)
    states, taken = [], 0
    for stop in stops:
        list(islice(node, stop - taken))
        taken = stop
        states.append(node.state_dict())
    node.close()
    return states, [list(_resumed(url, block_size, state)) for state in states]


def _resumed(url: str, block_size: int, state: dict[str, Any]) -> Any:
    node = dp.files(url).read_jsonl(block_size=block_size).build(Context())
    node.reset(state)
    return node


@pytest.mark.parametrize("block_size", [1 << 16, 128])
def test_resume_states_are_the_same_on_both_paths(tmp_path, monkeypatch, block_size):
    pytest.importorskip("orjson")
    data, expected = corpus(seed=7)
    url = write(tmp_path, "resume.jsonl", data)
    stops = [0, 1, 17, 18, 40, len(expected) - 1, len(expected)]
    fast_states, fast_rest = states_and_records(url, block_size, stops)
    monkeypatch.setattr(jsonl_module, "_orjson_loads", None)
    slow_states, slow_rest = states_and_records(url, block_size, stops)
    assert fast_states == slow_states
    for stop, fast, slow in zip(stops, fast_rest, slow_rest):
        assert canonical(fast) == canonical(slow) == canonical(expected[stop:])
    # A state saved with orjson resumes without it (and the other way round).
    assert canonical(_resumed(url, block_size, fast_states[2])) == canonical(expected[17:])


# ----- generated lines -----------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4)
    ),
    max_leaves=12,
)
VALID_LINES = st.builds(
    json.dumps,
    JSON_VALUES,
    ensure_ascii=st.booleans(),
    separators=st.sampled_from([(",", ":"), (", ", ": "), (" , ", " : ")]),
)
JUNK_LINES = st.text(alphabet='[]{},:" \t\r0123456789-.eEnul\\', max_size=12)


def _formats() -> tuple[JsonLinesFormat | None, JsonLinesFormat]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(jsonl_module, "_orjson_loads", None)
        stdlib = JsonLinesFormat()
    fast = JsonLinesFormat() if jsonl_module._orjson_loads is not None else None
    return fast, stdlib


def _expected_or_bad(chunk: bytes) -> list[Any] | None:
    try:
        return expected_records(chunk)
    except ValueError:
        return None


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(VALID_LINES | JUNK_LINES, max_size=8), st.sampled_from(["\n", "\r\n"]))
def test_generated_blocks_decode_like_json_loads(texts, ending):
    """A block either decodes to what json.loads gives line by line or goes to the per-line
    path (raises), on both paths; a block of bad lines never decodes."""
    chunk = "".join(text + ending for text in texts).encode()
    expected = _expected_or_bad(chunk)
    for fmt in _formats():
        if fmt is None:
            continue
        try:
            got = fmt.decode_records(chunk, None)
        except ValueError:
            continue
        assert expected is not None, texts
        assert canonical(got) == canonical(expected)
