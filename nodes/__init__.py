"""datapipes runtime: nodes, the context they run in, and the conformance kit.

Users normally build nodes from a recipe (``datapipes``); power users and
authors of custom steps use these classes directly.
"""

from nodes.base import Context, Node, ScopedContext, State
from nodes.batch import BatchNode, unbatch_items
from nodes.collate import default_collate, no_collate
from nodes.combine import ConcatNode, MixNode, ZipNode
from nodes.decode import DecodeNode, SampleDecoder
from nodes.errors import BadRecordError, ErrorPolicy
from nodes.files import FileListNode, FileSet
from nodes.prefetch import PrefetchNode
from nodes.readers import FileReaderNode, RecordFormat
from nodes.rng import IndexPermutation, UniformStream, stable_hash
from nodes.shuffle import BufferShuffleNode
from nodes.sources import IterableNode, SequenceNode
from nodes.transforms import FilterNode, FlatMapNode, MapNode, RepeatNode, TakeNode

__all__ = [
    "BadRecordError",
    "BatchNode",
    "BufferShuffleNode",
    "ConcatNode",
    "Context",
    "DecodeNode",
    "ErrorPolicy",
    "FileListNode",
    "FileReaderNode",
    "FileSet",
    "FilterNode",
    "FlatMapNode",
    "IndexPermutation",
    "IterableNode",
    "MapNode",
    "MixNode",
    "Node",
    "PrefetchNode",
    "RecordFormat",
    "RepeatNode",
    "SampleDecoder",
    "ScopedContext",
    "SequenceNode",
    "State",
    "TakeNode",
    "UniformStream",
    "ZipNode",
    "default_collate",
    "no_collate",
    "stable_hash",
    "unbatch_items",
]
