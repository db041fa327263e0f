"""datapipes runtime: nodes, the context they run in, and the conformance kit.

Users normally build nodes from a recipe (``datapipes``); power users and
authors of custom steps use these classes directly.

May import: nodes (its own packages; nothing of datapipes).
"""

from nodes.base import UPSTREAM, Node, State
from nodes.context import Context, ScopedContext
from nodes.errors import BadRecordError, ErrorPolicy
from nodes.media.decode import DecodeNode, SampleDecoder
from nodes.observe.stats import StatsNode
from nodes.origins import RandomMapError
from nodes.readers import FileReaderNode, RecordFormat
from nodes.rng import IndexPermutation, UniformStream, stable_hash
from nodes.sources.files import FileListNode, FileSet
from nodes.sources.iterable import IterableNode
from nodes.sources.sequence import SequenceNode
from nodes.steps.batch import BatchNode, unbatch_items
from nodes.steps.collate import default_collate, no_collate
from nodes.steps.combine import ConcatNode, MixNode, ZipNode
from nodes.steps.device import PinMemoryNode, ToDeviceNode
from nodes.steps.even import EvenBatchesNode
from nodes.steps.pack import PackNode
from nodes.steps.parallel_map import ParallelMapNode
from nodes.steps.prefetch import PrefetchNode
from nodes.steps.random_map import RandomMapNode
from nodes.steps.repeat import RepeatNode
from nodes.steps.shard import ShardNode, WholeDataContext
from nodes.steps.shuffle import BufferShuffleNode
from nodes.steps.tokenize import TokenizeNode
from nodes.steps.transforms import FilterNode, FlatMapNode, MapNode, TakeNode
from nodes.tensor_tree import apply_to_tensors
from nodes.workers.stream import WorkerStreamNode

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
