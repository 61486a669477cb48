"""Datasets: the :class:`PairedSplit` container, the seeded synthetic generator,
loaders for the paired-split layout (Flickr8k) and EPIC-KITCHENS-100 MIR relevancy,
and class distributions for TS++."""

from xmodal.data.classes import class_counts, kmeans_classes
from xmodal.data.epic import epic_annotations, epic_relevancy, epic_train_classes, relevancy_from_classes
from xmodal.data import layout
from xmodal.data.loaders import inspect_split, load_paired_split, read_captions
from xmodal.data.synthetic import synthetic, write_synthetic, zipf_probabilities
from xmodal.data.types import PairedSplit

__all__ = [
    "PairedSplit", "layout", "inspect_split", "synthetic", "write_synthetic", "zipf_probabilities", "load_paired_split", "read_captions",
    "epic_relevancy", "epic_annotations", "epic_train_classes", "relevancy_from_classes",
    "class_counts", "kmeans_classes",
]
