"""datapipes: composable, checkpointable data pipelines for PyTorch.

>>> import datapipes as dp
>>> pipe = dp.range(10).map(lambda x: x * x).filter(lambda x: x % 2 == 0).batch(2)
>>> [b.tolist() for b in dp.Loader(pipe)]
[[0, 4], [16, 36], [64]]

May import: nodes and every package of datapipes (this is the public face).
"""

from datapipes.checkpoint.dcp import load_dcp_states
from datapipes.checkpoint.saving import load_checkpoint, save_checkpoint
from datapipes.dispatch.takeover import (
    LeaseTakenWarning,
    TakeoverCheckpointError,
    UnfinishedEpochError,
)
from datapipes.integrations.hf_trainer import use_in_hf_trainer
from datapipes.integrations.torchtitan import TorchTitanLoader
from datapipes.integrations.trainers import TrainerLoader
from datapipes.loader.listings import ListingMismatchError
from datapipes.loader.loader import (
    InexactResumeWarning,
    InvalidStateError,
    Loader,
    StateMismatchError,
)
from datapipes.observe.rank_stats import RankStats
from datapipes.observe.stats import PipelineStats, StepStats
from datapipes.observe.trace import PipelineTrace, merge_traces
from datapipes.pipe import DataPipe
from datapipes.resume import merge_states
from datapipes.steps.combine import concat, mix, zip
from datapipes.steps.files import FileList, files
from datapipes.steps.iterables import from_iterable
from datapipes.steps.sources import from_sequence, range
from datapipes.topology import Topology
from datapipes.version import package_version
from datapipes.workers.torch_dataset import TorchDataset
from datapipes.write import (
    Manifest,
    ShardMismatchError,
    WriteConflictError,
    read_manifest,
    write,
)
from nodes.dispatch import DispatchStoreError
from nodes.elastic import ElasticResumeError
from nodes.errors import BadRecordError, BadRecordWarning
from nodes.steps.collate import default_collate, no_collate
from nodes.steps.even import UnevenDataWarning
from nodes.steps.random_map import RandomMapError
from nodes.workers.dataloader import WorkerDiedError

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
