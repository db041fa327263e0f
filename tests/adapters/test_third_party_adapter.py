"""nodes/adapters/third_party.py against a real ``.npy`` file and a real HF ``IterableDataset``.

Each private name the adapter reads is used as the adapter uses it; a numpy or
``datasets`` release that renames or reshapes one fails here, naming it.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from nodes.adapters import third_party as adapter
from nodes.readers.npy import read_npy_header

ADAPTER = "nodes/adapters/third_party.py"


def changed(library: str, name: str) -> str:
    return f"{library} changed {name}; update {ADAPTER}"


#: A structured dtype whose field name needs utf-8: numpy writes it as format 3.0.
UTF8_FIELDS = np.dtype([("température", "<f4"), ("n", "<i2")])


def npy_3_0(tmp_path: Path) -> Path:
    path = tmp_path / "utf8.npy"
    array = np.zeros(5, dtype=UTF8_FIELDS)
    array["n"] = np.arange(5)
    with open(path, "wb") as file:
        np.lib.format.write_array(file, array, version=(3, 0))
    return path


def test_numpys_private_header_reader_reads_a_format_3_0_header(tmp_path: Path) -> None:
    assert adapter._read_array_header is not None, changed(
        "numpy", "_read_array_header (numpy.lib._format_impl / numpy.lib.format)"
    )
    with open(npy_3_0(tmp_path), "rb") as file:
        assert np.lib.format.read_magic(file) == (3, 0)
        shape, fortran, dtype = adapter.read_npy_header_3_0(file)

    assert (shape, fortran, dtype) == ((5,), False, UTF8_FIELDS), changed(
        "numpy", "_read_array_header (what it returns)"
    )


def test_the_npy_reader_reads_format_3_0_through_the_adapter(tmp_path: Path) -> None:
    path = npy_3_0(tmp_path)
    with open(path, "rb") as file:
        shape, dtype, offset = read_npy_header(file, str(path))

    assert shape == (5,) and dtype == UTF8_FIELDS
    data = np.frombuffer(path.read_bytes()[offset:], dtype=dtype)
    assert data["n"].tolist() == [0, 1, 2, 3, 4]


def test_a_header_numpy_cannot_read_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        adapter.read_npy_header_3_0(io.BytesIO(b"\x00\x00not a header"))


def generate(shards: list[int]):
    for shard in shards:
        for index in range(4):
            yield {"shard": shard, "index": index}


def hf_dataset() -> object:
    datasets = pytest.importorskip("datasets")  # the numpy tests run without it
    return datasets.IterableDataset.from_generator(generate, gen_kwargs={"shards": [0, 1, 2]})


def test_an_hf_iterable_dataset_has_the_private_attributes_read() -> None:
    ds = hf_dataset()

    for name in ("_ex_iterable", "_distributed"):
        assert hasattr(ds, name), changed("datasets", f"IterableDataset.{name}")
    assert adapter.is_hf_like(ds)
    assert not adapter.is_hf_like([0, 1, 2])


def test_the_shuffle_buffer_is_read_off_the_example_iterables() -> None:
    plain = hf_dataset()
    shuffled = plain.shuffle(seed=0, buffer_size=7)

    chain = adapter.hf_example_iterables(shuffled)
    assert chain, changed("datasets", "IterableDataset._ex_iterable")
    sizes = [adapter.hf_buffer_shuffle_size(node) for node in chain]
    assert 7 in sizes, changed(
        "datasets", "BufferShuffledExamplesIterable (its name, buffer_size or ex_iterable)"
    )
    unshuffled = adapter.hf_example_iterables(plain)
    assert all(adapter.hf_buffer_shuffle_size(node) is None for node in unshuffled)
    assert len(chain) > 1, changed("datasets", "the example iterables' 'ex_iterable' chain")


def test_a_split_is_read_off_the_dataset() -> None:
    ds = hf_dataset()
    from datasets.distributed import split_dataset_by_node

    assert adapter.hf_split(ds) is None, changed("datasets", "IterableDataset._distributed")

    split = adapter.hf_split(split_dataset_by_node(ds, rank=1, world_size=3))

    assert split is not None and (split.rank, split.world_size) == (1, 3), changed(
        "datasets", "IterableDataset._distributed (its rank and world_size)"
    )
    assert isinstance(split.strategy, str), changed("datasets", "_distributed.strategy")
