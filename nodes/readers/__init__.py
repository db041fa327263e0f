"""File readers: a node that deals file parts to consumers, and one format per file type.

May import: nodes.base, nodes.context, nodes.errors, nodes.state_checks, nodes.iterators,
nodes.storage, nodes.sources, nodes.elastic, nodes.adapters.
"""

from nodes.readers.csv_format import CsvFormat
from nodes.readers.format import RecordFormat
from nodes.readers.jsonl import JsonLinesFormat
from nodes.readers.lines import LineFormat
from nodes.readers.npy import NpyFormat
from nodes.readers.parquet import ParquetFormat
from nodes.readers.raw import BytesFormat
from nodes.readers.reader import FileReaderNode
from nodes.readers.tar.samples import TarFormat

__all__ = [
    "BytesFormat",
    "CsvFormat",
    "FileReaderNode",
    "JsonLinesFormat",
    "LineFormat",
    "NpyFormat",
    "ParquetFormat",
    "RecordFormat",
    "TarFormat",
]
