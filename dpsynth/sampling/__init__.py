"""`dpsynth sample`: draw synthetic records from a trained run and write them out.

Sampling reads no private data: it runs the saved generator, so it is post-processing of what
the training mechanism released and costs no privacy. It is still recorded in the ledger, as a
zero-cost release event with the SHA-256 of what was written, so a data owner can tie every
file that left the machine to a run and its spend.
"""

from dpsynth.sampling.images import MAX_SAMPLES, generate, sample_run
from dpsynth.sampling.labels import (
    label_chunks,
    label_counts,
    parse_labels,
    table_label_counts,
    weighted_counts,
)
from dpsynth.sampling.options import SampleOptions
from dpsynth.sampling.outputs import (
    PartitionProgress,
    SampleProgress,
    is_sample_output,
    manifest_of,
    table_manifest_path,
)
from dpsynth.sampling.partitions import PARTITION_ROWS
from dpsynth.sampling.table import sample_table
from dpsynth.sampling.trained_run import load_generator, run_privacy, set_truncation

__all__ = [
    "MAX_SAMPLES",
    "PARTITION_ROWS",
    "PartitionProgress",
    "SampleOptions",
    "SampleProgress",
    "generate",
    "is_sample_output",
    "label_chunks",
    "label_counts",
    "load_generator",
    "manifest_of",
    "parse_labels",
    "run_privacy",
    "sample_run",
    "sample_table",
    "set_truncation",
    "table_label_counts",
    "table_manifest_path",
    "weighted_counts",
]
