"""datapipes runtime: nodes, the context they run in, and the conformance kit.

Users normally build nodes from a recipe (``datapipes``); power users and
authors of custom steps use these classes directly.
"""

from nodes.base import UPSTREAM, Context, Node, ScopedContext, State
from nodes.batch import BatchNode, unbatch_items
from nodes.collate import default_collate, no_collate
from nodes.combine import ConcatNode, MixNode, ZipNode
from nodes.decode import DecodeNode, SampleDecoder
from nodes.device import PinMemoryNode, ToDeviceNode
from nodes.errors import BadRecordError, ErrorPolicy
from nodes.even import EvenBatchesNode
from nodes.files import FileListNode, FileSet
from nodes.iterable import IterableNode
from nodes.origins import RandomMapError
from nodes.pack import PackNode
from nodes.parallel_map import ParallelMapNode
from nodes.prefetch import PrefetchNode
from nodes.random_map import RandomMapNode
from nodes.readers import FileReaderNode, RecordFormat
from nodes.repeat import RepeatNode
from nodes.rng import IndexPermutation, UniformStream, stable_hash
from nodes.shard import ShardNode, WholeDataContext
from nodes.shuffle import BufferShuffleNode
from nodes.sources import SequenceNode
from nodes.stats import StatsNode
from nodes.tensor_tree import apply_to_tensors
from nodes.tokenize import TokenizeNode
from nodes.transforms import FilterNode, FlatMapNode, MapNode, TakeNode
from nodes.workers import WorkerStreamNode

__all__ = [
    "BadRecordError",
    "BatchNode",
    "BufferShuffleNode",
    "ConcatNode",
    "Context",
    "DecodeNode",
    "ErrorPolicy",
    "EvenBatchesNode",
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
    "PackNode",
    "ParallelMapNode",
    "PinMemoryNode",
    "PrefetchNode",
    "RandomMapError",
    "RandomMapNode",
    "RecordFormat",
    "RepeatNode",
    "SampleDecoder",
    "ScopedContext",
    "SequenceNode",
    "ShardNode",
    "State",
    "StatsNode",
    "TakeNode",
    "ToDeviceNode",
    "TokenizeNode",
    "UPSTREAM",
    "UniformStream",
    "WholeDataContext",
    "WorkerStreamNode",
    "ZipNode",
    "apply_to_tensors",
    "default_collate",
    "no_collate",
    "stable_hash",
    "unbatch_items",
]
