"""The decode step checks its options when the recipe is built (datapipes/steps/decode.py)."""

from __future__ import annotations

import pytest

import datapipes as dp


def test_a_decoder_that_is_not_a_function_is_refused_when_the_recipe_is_built() -> None:
    with pytest.raises(TypeError, match=r"decode\(\) takes functions as decoders, got int for 'x'"):
        dp.from_sequence([{"x": b"1"}]).decode(decoders={"x": 3})  # type: ignore[dict-item]


def test_a_decoder_of_none_turns_a_field_off_and_one_of_the_user_s_is_used() -> None:
    sample = {"__key__": "a", "json": b'{"x": 1}', "x": b"7"}
    pipe = dp.from_sequence([sample]).decode(decoders={"json": None, "x": int})
    assert list(dp.Loader(pipe)) == [{"__key__": "a", "json": b'{"x": 1}', "x": 7}]


def test_device_decoding_needs_the_chw_layout() -> None:
    with pytest.raises(ValueError, match="image must be 'chw'"):
        dp.from_sequence([{"x": b""}]).decode(image="hwc", device="cpu")
