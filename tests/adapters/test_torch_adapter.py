"""nodes/adapters/torch.py against real torch.distributed objects: a process group, a DCP save.

Each private name the adapter reads is looked up in the installed torch, and used as
the adapter uses it; a torch release that renames or reshapes one fails here, naming
it, instead of breaking dynamic dispatch or ``datapipes-inspect`` in a user's job.
"""

from __future__ import annotations

import datetime
import importlib
import pickle
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from datapipes.checkpoint.reading import read_dcp
from nodes.adapters import torch as adapter

ADAPTER = "nodes/adapters/torch.py"


def changed(name: str) -> str:
    return f"torch changed {name}; update {ADAPTER}"


#: Every private name the adapter reads (module, attribute path); the globals of a DCP
#: .metadata pickle are checked separately, against a real one.
PRIVATE_NAMES = [
    ("torch.distributed.distributed_c10d", "_get_default_store"),
    ("torch.distributed.checkpoint.default_planner", "_EmptyStateDictLoadPlanner"),
    (
        "torch.distributed.checkpoint.default_planner",
        "_EmptyStateDictLoadPlanner._should_include_key",
    ),
    ("torch.distributed.checkpoint.state_dict_loader", "_load_state_dict"),
    ("torch.distributed.checkpoint._traverse", "set_element"),
    *sorted(adapter.DCP_METADATA_GLOBALS),
]


@pytest.mark.parametrize(("module", "path"), PRIVATE_NAMES)
def test_each_private_name_is_still_in_torch(module: str, path: str) -> None:
    name = f"{module}.{path}"
    try:
        found: Any = importlib.import_module(module)
    except ImportError:
        pytest.fail(changed(f"the module {module} (for {name})"))
    for part in path.split("."):
        assert hasattr(found, part), changed(name)
        found = getattr(found, part)
    assert callable(found), changed(f"{name} (no longer callable)")


def test_the_profiler_flag_and_span_ops_work_inside_a_real_profiler() -> None:
    # torch.ops.profiler is no module (not in PRIVATE_NAMES): its ops are checked by use
    for op in ("_record_function_enter_new", "_record_function_exit"):
        assert hasattr(torch.ops.profiler, op), changed(f"torch.ops.profiler.{op}")
    from torch.autograd import profiler

    assert isinstance(profiler._is_profiler_enabled, bool), changed("_is_profiler_enabled")
    assert not adapter.profiler_running()
    with torch.profiler.profile() as prof:
        assert adapter.profiler_running()
        handle = adapter.profiler_span_enter("datapipes: adapter check")
        torch.ones(3).sum()
        adapter.profiler_span_exit(handle)
    assert not adapter.profiler_running()
    assert "datapipes: adapter check" in {event.name for event in prof.events()}


def test_the_default_store_is_the_process_groups_own(tmp_path: Path) -> None:
    assert adapter.default_store() is None  # no process group
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group(
        "gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=60)
    )
    try:
        found = adapter.default_store()
        assert isinstance(found, dist.Store), changed("_get_default_store (not a Store)")
        while isinstance(found, dist.PrefixStore):  # as dispatch unwraps it
            found = found.underlying_store
        assert found is store, changed("_get_default_store (not the store the group was made with)")
        store.set("written-by-the-group", b"seen")
        assert found.get("written-by-the-group") == b"seen"
    finally:
        dist.destroy_process_group()
    assert adapter.default_store() is None


SAVED = {
    "model": {"layer": {"weight": torch.arange(6.0).reshape(2, 3)}},
    "loader": {"epoch": 3, "ranks": {"0": [1, "two"]}},
    "step": 7,
}


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    folder = tmp_path / "dcp"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming a single process"
        dcp.save(SAVED, checkpoint_id=str(folder), no_dist=True)
    return folder


class Recording(pickle.Unpickler):
    """Unpickles (our own test file: trusted), recording every global the pickle names."""

    def __init__(self, file: Any) -> None:
        super().__init__(file)
        self.globals: set[tuple[str, str]] = set()

    def find_class(self, module: str, name: str) -> Any:
        self.globals.add((module, name))
        return super().find_class(module, name)


def metadata_of(folder: Path) -> tuple[Any, set[tuple[str, str]]]:
    with open(folder / ".metadata", "rb") as file:
        unpickler = Recording(file)
        return unpickler.load(), unpickler.globals


def test_a_dcp_metadata_pickle_names_only_the_private_globals_listed(saved: Path) -> None:
    _, named = metadata_of(saved)
    for module, name in sorted(named):
        private = name.startswith("_") and module != adapter.DCP_METADATA_MODULE
        assert not private or (module, name) in adapter.DCP_METADATA_GLOBALS, (
            f"a DCP .metadata pickle now names {module}.{name}, which the safe unpickler "
            f"refuses; if it is plain data, add it to DCP_METADATA_GLOBALS in {ADAPTER}"
        )
    for module, name in sorted(adapter.DCP_METADATA_GLOBALS):
        assert (module, name) in named, (
            f"a DCP .metadata pickle no longer names {module}.{name}; "
            f"take it out of DCP_METADATA_GLOBALS in {ADAPTER} (and see what names it now)"
        )
    assert any(module == adapter.DCP_METADATA_MODULE for module, _ in named), changed(
        f"DCP_METADATA_MODULE ({adapter.DCP_METADATA_MODULE})"
    )


def test_load_dcp_entries_reads_the_chosen_bytes_entries_and_no_tensor(saved: Path) -> None:
    metadata, _ = metadata_of(saved)
    loads: list[Any] = []

    def load(value: Any) -> Any:
        loads.append(value)
        return torch.load(value, weights_only=True)

    state = adapter.load_dcp_entries(saved, metadata, include=lambda key: True, load=load)

    assert state == {"loader": SAVED["loader"], "step": 7}, changed(
        "_EmptyStateDictLoadPlanner._should_include_key or _load_state_dict "
        "(entries missing, or a tensor loaded)"
    )
    assert len(loads) == 3  # each bytes entry through the given load, once
    only = adapter.load_dcp_entries(saved, metadata, include=lambda key: key == "step", load=load)
    assert only == {"step": 7}, changed("_EmptyStateDictLoadPlanner._should_include_key")


def test_set_nested_places_values_where_dcp_flattened_them_from(saved: Path) -> None:
    metadata, _ = metadata_of(saved)
    state: dict[str, Any] = {}
    for key, path in metadata.planner_data.items():
        adapter.set_nested(state, path, key)

    assert state["model"]["layer"]["weight"] == "model.layer.weight", changed("set_element")
    assert state["loader"]["epoch"] == "loader.epoch", changed("set_element")


def test_inspect_reads_a_real_dcp_folder_through_the_adapter(saved: Path) -> None:
    state = read_dcp(saved)

    assert state["loader"] == SAVED["loader"] and state["step"] == 7
    assert state["model"]["layer"]["weight"] == "<tensor [2, 3] torch.float32, not loaded>"
