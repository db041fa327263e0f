"""datapipes: composable, checkpointable data pipelines for PyTorch.

>>> import datapipes as dp
>>> pipe = dp.range(10).map(lambda x: x * x).filter(lambda x: x % 2 == 0).batch(2)
>>> [b.tolist() for b in dp.Loader(pipe)]
[[0, 4], [16, 36], [64]]
"""

from datapipes.combine import concat, mix, zip
from datapipes.dcp_states import load_dcp_states
from datapipes.files import FileList, files
from datapipes.hf_trainer import use_in_hf_trainer
from datapipes.iterables import from_iterable
from datapipes.listings import ListingMismatchError
from datapipes.loader import InexactResumeWarning, InvalidStateError, Loader, StateMismatchError
from datapipes.pipe import DataPipe
from datapipes.rank_stats import RankStats
from datapipes.resume import merge_states
from datapipes.saving import load_checkpoint, save_checkpoint
from datapipes.sources import from_sequence, range
from datapipes.stats import PipelineStats, StepStats
from datapipes.takeover import LeaseTakenWarning, TakeoverCheckpointError, UnfinishedEpochError
from datapipes.topology import Topology
from datapipes.torch_dataset import TorchDataset
from datapipes.torchtitan import TorchTitanLoader
from datapipes.trace import PipelineTrace, merge_traces
from datapipes.trainers import TrainerLoader
from datapipes.version import package_version
from datapipes.write import (
    Manifest,
    ShardMismatchError,
    WriteConflictError,
    read_manifest,
    write,
)
from nodes.collate import default_collate, no_collate
from nodes.dispatch import DispatchStoreError
from nodes.elastic import ElasticResumeError
from nodes.errors import BadRecordError, BadRecordWarning
from nodes.even import UnevenDataWarning
from nodes.random_map import RandomMapError
from nodes.workers import WorkerDiedError

__version__: str = package_version()

__all__ = [
    "__version__",
    "BadRecordError",
    "BadRecordWarning",
    "DataPipe",
    "DispatchStoreError",
    "ElasticResumeError",
    "FileList",
    "InexactResumeWarning",
    "InvalidStateError",
    "LeaseTakenWarning",
    "ListingMismatchError",
    "Loader",
    "Manifest",
    "PipelineStats",
    "PipelineTrace",
    "RandomMapError",
    "RankStats",
    "StateMismatchError",
    "StepStats",
    "TakeoverCheckpointError",
    "Topology",
    "TrainerLoader",
    "TorchTitanLoader",
    "TorchDataset",
    "UnevenDataWarning",
    "UnfinishedEpochError",
    "WorkerDiedError",
    "ShardMismatchError",
    "WriteConflictError",
    "concat",
    "default_collate",
    "files",
    "from_iterable",
    "from_sequence",
    "load_checkpoint",
    "load_dcp_states",
    "merge_states",
    "merge_traces",
    "mix",
    "no_collate",
    "range",
    "read_manifest",
    "save_checkpoint",
    "write",
    "zip",
    "use_in_hf_trainer",
]
