"""Every use of torch's private names outside the DataLoader, in one place.

torch offers no public API for what follows, so this module reads private names,
and nothing else in datapipes or nodes does (the DataLoader's and torchdata's
are in :mod:`nodes.adapters.torchdata`):

- ``torch.distributed.distributed_c10d._get_default_store``: the store of the
  default process group, which dynamic dispatch shares (:func:`default_store`);
- ``torch.distributed.checkpoint.default_planner._EmptyStateDictLoadPlanner``
  and its ``_should_include_key`` method (overridden), with
  ``torch.distributed.checkpoint.state_dict_loader._load_state_dict``: reading
  the entries a DCP folder saved as bytes, without a collective and without
  loading a tensor (:func:`load_dcp_entries`);
- ``torch.distributed.checkpoint._traverse.set_element``: placing a value in a
  nested state at the path DCP flattened it from (:func:`set_nested`);
- the private globals a DCP ``.metadata`` pickle names, which a safe unpickler
  must allow (:data:`DCP_METADATA_GLOBALS`): ``torch.serialization._get_layout``
  (a tensor's layout) and ``torch.distributed.checkpoint.filesystem._StorageInfo``
  (where an entry's bytes are); the metadata module's own private classes (e.g.
  ``_MEM_FORMAT_ENCODING``) come with the rest of that module;
- ``torch.autograd.profiler._is_profiler_enabled``: whether a ``torch.profiler``
  records in this process, read per timed item, where the public
  ``record_function`` would cost a span always (:func:`profiler_running`);
- ``torch.ops.profiler._record_function_enter_new`` and
  ``_record_function_exit._RecordFunction``: the ops ``record_function`` calls,
  without its context-manager machinery (:func:`profiler_span_enter`,
  :func:`profiler_span_exit`).

Checked against torch 2.13. ``tests/adapters/test_torch_adapter.py`` uses each against a
real process group, a real DCP save and its ``.metadata`` pickle, and fails
naming the name when a torch release changes it; update this module then.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from torch.autograd import profiler as autograd_profiler

#: The module whose classes a DCP ``.metadata`` pickle is made of.
DCP_METADATA_MODULE = "torch.distributed.checkpoint.metadata"

#: Private globals (module, name) of other modules that a DCP ``.metadata`` pickle names.
DCP_METADATA_GLOBALS = frozenset(
    {
        ("torch.serialization", "_get_layout"),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    }
)


def profiler_running() -> bool:
    """Whether a ``torch.profiler`` (or ``torch.autograd.profiler``) records in this process
    (read per timed item: one module attribute)."""
    return autograd_profiler._is_profiler_enabled


def profiler_span_enter(name: str) -> Any:
    """Open a ``torch.profiler`` span named ``name``; its handle goes to
    :func:`profiler_span_exit`."""
    import torch

    return torch.ops.profiler._record_function_enter_new(name, None)


def profiler_span_exit(handle: Any) -> None:
    """Close the span :func:`profiler_span_enter` opened."""
    import torch

    torch.ops.profiler._record_function_exit._RecordFunction(handle)


def default_store() -> Any:
    """The store of torch.distributed's default process group (``None`` when none is set up).

    The process group's store is what every rank already reaches; torch keeps it
    without a public accessor.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    from torch.distributed.distributed_c10d import _get_default_store

    return _get_default_store()


def set_nested(state: dict[str, Any], path: Sequence[Any], value: Any) -> None:
    """Put ``value`` in ``state`` at ``path`` (keys and list indices, as DCP's planner data
    records them), making the dicts and lists on the way."""
    from torch.distributed.checkpoint._traverse import set_element

    set_element(state, tuple(path), value)


def load_dcp_entries(
    folder: Path,
    metadata: Any,
    include: Callable[[str], bool],
    load: Callable[[io.BytesIO], Any],
) -> dict[str, Any]:
    """The entries of DCP folder ``folder`` saved as bytes (not tensors) that ``include``
    accepts (by flattened key), each made by ``load`` from its bytes, nested as saved.

    ``metadata`` is the folder's metadata, already read (never unpickled again here).
    No collective runs, even when a process group is up.
    """
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, StorageMeta
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    class BytesOnlyPlanner(_EmptyStateDictLoadPlanner):
        """Plans to load only the chosen entries saved as bytes, as plain data."""

        def _should_include_key(self, key: str, md: Any) -> bool:
            plain = isinstance(md.state_dict_metadata[key], BytesStorageMetadata)
            return plain and include(key)

        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            loaded = load(value)
            fqn = read_item.dest_index.fqn
            if self.flatten_state_dict:
                set_nested(self.original_state_dict, self.mappings[fqn], loaded)
            else:
                self.state_dict[fqn] = loaded

    class ReadMetadata(FileSystemReader):
        """Hands out the metadata already read instead of unpickling the file again."""

        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    state: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP's "assuming a single process" notice
        _load_state_dict(
            state, storage_reader=ReadMetadata(folder), planner=BytesOnlyPlanner(), no_dist=True
        )
    return state
