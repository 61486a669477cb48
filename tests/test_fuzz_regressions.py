"""The inputs the deep fuzz profile found (issue 25.8, seeds 1-3 of round 5), replayed one by one:
each raised something other than a one-line ValueError / TypeError before its fix. The fuzz
suite explores at random; this file keeps every found case failing loudly if it comes back."""

from __future__ import annotations

import numpy as np
import pytest
import torch

ARRAY = np.arange(20, dtype=np.float32).reshape(5, 4)  # its repr spans several lines
EMPTY = torch.tensor([])


def _one_line(call, *, exc=(ValueError, TypeError), match: str | None = None) -> str:
    with pytest.raises(exc) as info:
        call()
    msg = str(info.value)
    assert "\n" not in msg.strip(), msg
    if match is not None:
        assert match in msg, msg
    return msg


def test_config_functions_name_junk():
    from xmodal import config

    _one_line(lambda: config.to_dict(None), match="cfg: expected an xmodal.config.Config")
    _one_line(lambda: config.validate(None), match="cfg:")
    _one_line(lambda: config.config_text(ARRAY), match="cfg:")
    _one_line(lambda: config.from_dict(EMPTY), match="config: expected a mapping")
    _one_line(lambda: config.apply_overrides(ARRAY, []), match="d: expected a nested dict")
    _one_line(lambda: config.apply_overrides({"a": ARRAY}, []), match="d: holds a value that is not plain YAML")
    _one_line(lambda: config.parse_overrides(torch.tensor([0.5])), match="overrides:")
    _one_line(lambda: config.parse_overrides([3]), match="overrides: expected 'section.key=value' strings")
    _one_line(lambda: config.replace(config.from_dict({}), train=ARRAY), match="train: expected a dict")


def test_training_fit_names_junk():
    from xmodal.training import fit

    _one_line(lambda: fit(False, {}), match="config: expected an xmodal.config.Config")
    _one_line(lambda: fit(ARRAY, np.float32(1.0)), match="config:")
    from xmodal.config import from_dict

    _one_line(lambda: fit(from_dict({}), ARRAY), match="splits: expected")


def test_data_check_and_groups_name_junk():
    from xmodal.data import check, groups

    _one_line(lambda: check.check_same_sizes(ARRAY), match="splits: expected")
    _one_line(lambda: check.cross_split_problems("x", ARRAY), match="arrays: expected")
    _one_line(lambda: check.frames_note(float("inf")), match="lengths:")
    _one_line(lambda: check.split_name_notes(ARRAY), match="names: expected a list of strings")
    _one_line(lambda: check.summarize(ARRAY), match="arrays: expected")
    _one_line(lambda: groups.group_problems([5], torch.tensor([1.0, 2.0])), match="num_videos:")
    _one_line(lambda: groups.check_groups(None, True, ARRAY), match="label: expected a string")
    _one_line(lambda: groups.group_rows(float("inf")), match="expected a 1-d integer array")
    _one_line(lambda: groups.order_clips(ARRAY, ARRAY), match="rows: expected a list of dicts")
    _one_line(lambda: groups.paragraph_texts(np.array([np.nan]), np.array([0])), match="text_to_video:")
    _one_line(lambda: groups.subset_groups(np.array([0, 0]), np.array([np.nan])), match="rows:")
    _one_line(lambda: groups.shared_groups(ARRAY), match="group_names:")


def test_data_importer_names_junk(tmp_path):
    from xmodal.data import importer

    _one_line(lambda: importer.check_video_id(ARRAY, "where"), match="video id")
    _one_line(lambda: importer.check_group_name([0], ARRAY), match="where: expected a string")
    _one_line(lambda: importer.feature_files(ARRAY, ["a"]), match="--features: expected a directory or a glob")
    _one_line(lambda: importer.feature_files("x" * 5000, ["a"]), match="--features:")
    _one_line(lambda: importer.pad_frames([0]), match="per_video:")
    _one_line(lambda: importer.pad_expert("none"), match="per_video:")
    _one_line(lambda: importer.pad_expert([None], name=ARRAY), match="name:")
    _one_line(lambda: importer.parse_experts(torch.zeros(2, 2)), match="specs:")
    _one_line(lambda: importer.sample_frames([], 2), match="arr:")
    _one_line(lambda: importer.sample_frames(np.zeros((4, 2)), 2.5), match="max_frames:")


def test_functional_helpers_name_junk():
    from xmodal.functional import calince, crossclr, ncl, sinkhorn

    _one_line(lambda: calince.derangement(3, device=3) if not torch.cuda.is_available() else calince.derangement(ARRAY),
              match="")
    _one_line(lambda: calince.derangement(ARRAY), match="n:")
    _one_line(lambda: calince.derangement(3, generator=ARRAY), match="generator:")
    v = torch.randn(4, 2)
    _one_line(lambda: calince.calibrated_nce(v, v, {}, temperature=0.1), match="weights:")
    assert crossclr.connectivity(torch.ones(3, 2, dtype=torch.long)).dtype == torch.float32  # ints promoted
    _one_line(lambda: crossclr.connectivity(torch.ones(3, 2, dtype=torch.bool)), match="inputs:")
    _one_line(lambda: crossclr.connectivity([]), match="inputs:")
    _one_line(lambda: crossclr.connectivity(torch.randn(4, 5), torch.randn(3, 4)), match="bank:")
    _one_line(lambda: crossclr.influence_scores(torch.tensor([True, False])), match="conn:")
    _one_line(lambda: crossclr.connectivity_weights(ARRAY, ARRAY), match="conn:")
    _one_line(lambda: ncl.scalar_temperature(torch.tensor([0.1, 0.2]), name=ARRAY), match="name:")
    _one_line(lambda: sinkhorn.sinkhorn_plan(torch.randn(3, 3), gamma=0.1, iters=ARRAY), match="iters:")


def test_metrics_and_losses_name_junk():
    from xmodal import metrics
    from xmodal.losses.ncl import fifo_enqueue
    from xmodal.metrics import diagnostics, ranking

    _one_line(lambda: metrics.head_tail_groups([4, 6, 5], tail_classes=[float("inf")]), match="tail_classes:")
    _one_line(lambda: metrics.head_tail_groups([4], tail_classes=torch.tensor([[-np.inf]])), match="tail_classes:")
    _one_line(lambda: metrics.retrieval(ARRAY, np.arange(5) % 4, block_size=ARRAY), match="block_size:")
    _one_line(lambda: diagnostics.check_finite(ARRAY, ARRAY), match="name: expected a string")
    _one_line(lambda: diagnostics.check_finite(torch.tensor([np.nan]), "t"), match="t: contains 1 NaN/inf")
    _one_line(lambda: ranking.caption_groups(np.array([0]), 1, ARRAY), match="num_videos:")
    _one_line(lambda: ranking.caption_groups(np.array([0]), 1, 1, name=ARRAY), match="name:")
    _one_line(lambda: ranking.group_max([], ARRAY, 5), match="")
    _one_line(lambda: ranking.group_max(torch.rand(2, 3), torch.tensor([0, 1, 7]), 3), match="t2v: video indices")
    _one_line(lambda: fifo_enqueue(ARRAY[:0], ARRAY, -1.0), match="size:")
    _one_line(lambda: fifo_enqueue(torch.zeros(1, 5), {}, 4), match="new:")


def test_schedules_counts_and_class_counts_name_junk():
    from xmodal.schedules import counts_from_labels

    _one_line(lambda: counts_from_labels([3], torch.tensor([-0.6, 1.6])), match="num_classes:")
    assert counts_from_labels([0, 2, 2], 2).tolist() == [1, 0, 2]


def test_retrieval_and_reporting_name_junk():
    from xmodal.reporting import run_grid
    from xmodal.retrieval import retrieval_metrics
    from xmodal.retrieval.build import check_out

    s = torch.tensor([[-0.3]])
    _one_line(lambda: retrieval_metrics(s, s, torch.tensor(-0.1), block_size=3), match="text_to_video:")
    _one_line(lambda: check_out(float("inf"), "run", overwrite=False), match="out: expected a path")
    _one_line(lambda: run_grid(datasets=torch.tensor([0.6]), objectives=["infonce"], seeds=[0], out="o"),
              match="datasets:")
    _one_line(lambda: run_grid(datasets=["synthetic"], objectives=["bogus"], seeds=[0], out="o"),
              match="objectives: unknown 'bogus'")
    _one_line(lambda: run_grid(datasets=["synthetic"], objectives=["infonce"], seeds=[1.5], out="o"),
              match="seeds:")


def test_epic_readers_name_a_junk_split():
    from xmodal.data import epic_annotations, epic_relevancy

    _one_line(lambda: epic_annotations("", split=ARRAY.astype(np.int64)), match="split: expected a split name")
    _one_line(lambda: epic_relevancy("", split=ARRAY), match="split:")


def test_losses_name_a_junk_normalize_switch():
    from xmodal.functional import max_margin, ncl_loss

    v = torch.randn(3, 4)
    for fn in (max_margin, ncl_loss):
        _one_line(lambda: fn(v, v, normalize=torch.ones(5)), match="normalize: expected True or False")


def test_schedules_name_a_junk_switch():
    from xmodal.schedules import Constant, Cosine, Linear

    for make in (lambda z: Constant(0.1, allow_zero=z), lambda z: Cosine(0.1, 0.05, 10, allow_zero=z),
                 lambda z: Linear(0.1, 0.05, 10, allow_zero=z)):
        _one_line(lambda: make(torch.randn(3, 1, 5)), match="allow_zero: expected True or False")
        assert make(True).allow_zero is True


def test_deep_seed_3643064420_findings():
    from xmodal.data.importer import import_pairs
    from xmodal.functional.sinkhorn import sinkhorn_plan

    _one_line(lambda: import_pairs(None, features=False, out=False, max_frames=float("inf")), match="--max-frames:")
    assert sinkhorn_plan(np.array([[4.0]]), gamma=1, iters=1).tolist() == [[1.0]]  # numpy in, as log_sinkhorn


def test_round6_cases_name_junk():
    """Found after the scale / compare / hierarchy merges (quick profile, seeds 4253809690, 5-12;
    deep profile, seeds 161803398, 271828182, 314159265)."""
    from xmodal.data import PairedSplit
    from xmodal.functional import mil_nce
    from xmodal.retrieval.index import BiasedIndex
    from xmodal.retrieval.recall import recall_at_k, smallest_reaching
    from xmodal.retrieval.rowstore import RowStore, ShiftedRows
    from xmodal.retrieval.selection import select_normalizer
    from xmodal.training.batches import EpochBatches, batch_loader, to_device

    x = torch.tensor([[0.1257]])
    _one_line(lambda: mil_nce(x, x, joint=EMPTY), match="joint:")
    _one_line(lambda: BiasedIndex(np.False_), match="gallery")
    _one_line(lambda: PairedSplit(video=None, text=ARRAY, text_to_video=np.arange(5)), match="video:")
    _one_line(lambda: recall_at_k(None, None, None), match="k:")
    _one_line(lambda: smallest_reaching(None, [1], 0.9), match="measure:")
    _one_line(lambda: ShiftedRows(None, None), match="rows:")
    _one_line(lambda: RowStore(3, float("inf")), match="dim:")
    _one_line(lambda: select_normalizer("", {}, None, "rsum"), match="names:")
    _one_line(lambda: select_normalizer(["none"], {}, None, "rsum", rule=torch.tensor([[4], [2]])), match="rule:")
    _one_line(lambda: EpochBatches(None, text=False, text_mask=None, video=ARRAY, video_mask=None,
                                   text_to_video=np.arange(5), rank=float("inf")), match="batches:")
    _one_line(lambda: batch_loader(None, workers=EMPTY), match="dataset:")
    _one_line(lambda: to_device(None, None, "no-such-device"), match="device:")


def test_deep_seed_20261128_findings(tmp_path):
    """Issue 44 item 10: a tensor as ``dtype`` was numpy's multi-line "Could not convert tensor(...)"."""
    from xmodal.retrieval.build import write_rows_npy

    _one_line(lambda: write_rows_npy(tmp_path / "x.npy", ARRAY, dtype=torch.tensor([[4], [2]])), match="dtype:")
    _one_line(lambda: write_rows_npy(tmp_path / "x.npy", ARRAY, dtype="no-such-dtype"), match="dtype:")
    write_rows_npy(tmp_path / "x.npy", ARRAY, dtype=np.float16)  # a real dtype still writes
    assert np.load(tmp_path / "x.npy").tolist() == ARRAY.astype(np.float16).tolist()
