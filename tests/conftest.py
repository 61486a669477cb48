"""Shared test fixtures."""
import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models: one thread is fastest, and spinning threads crawl on a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True, scope="session")
def curve_rates_by_setting():
    """An index build keeps the setting of its measured curve no other row beats, by queries/s
    (:mod:`xmodal.retrieval.curve`): on a wall clock the choice would follow the machine's load. Tests get
    a cost model instead: queries/s falls with nprobe / efSearch and the exact scan is the slowest, so a
    build keeps the smallest setting reaching its target. A test of the rule sets its own model."""
    from xmodal.retrieval import curve

    def rate(run, n_queries, setting):
        run()
        if setting.get("exact"):
            return 1e-3
        (value,) = [v for k, v in setting.items() if k != "exact"]
        return 1e6 / float(value)

    patch = pytest.MonkeyPatch()
    patch.setattr(curve, "timed_rate", rate)
    yield
    patch.undo()


def spawn_gloo(worker, nprocs: int, init_file: str, *args) -> None:
    """``mp.spawn(worker, (init_file, *args))`` that tells a failed check from a gloo teardown abort.

    Each worker calls :func:`mark_done` after its last assertion, before tearing the group down.
    On a heavily loaded machine gloo has (rarely) aborted a rank with SIGABRT while destroying the
    process group after every check had passed; that case is accepted only when every rank wrote its
    marker. An assertion error in a worker, or an abort before a marker, still fails the test.
    """
    import signal
    from pathlib import Path

    import torch.multiprocessing as mp

    try:
        mp.spawn(worker, args=(init_file, *args), nprocs=nprocs, join=True)
    except mp.ProcessExitedException as exc:
        done = all(Path(f"{init_file}.done{r}").is_file() for r in range(nprocs))
        if not (done and exc.exit_code == -signal.SIGABRT):
            raise


def mark_done(init_file: str, rank: int) -> None:
    """Record that this rank passed every check (see :func:`spawn_gloo`)."""
    from pathlib import Path

    Path(f"{init_file}.done{rank}").touch()


# ----------------------------------------------------------------------------- hypothesis
# Random seeds, no example database: every run explores new inputs. The session's seed is
# printed in the header and again after a failure; rerun it with
#   pytest --hypothesis-seed=SEED   (or XMODAL_FUZZ_SEED=SEED).
# Profiles: "ci" (default; bounded so the fuzz tests stay within ~2-3 min on 2 cores) and
# "deep" (HYPOTHESIS_PROFILE=deep: 20x the examples, for a long local search).
try:
    from hypothesis import HealthCheck
    from hypothesis import settings as _hsettings
except ImportError:  # pragma: no cover - hypothesis is in the [dev] extra
    _hsettings = None

_FUZZ_SEED = None

if _hsettings is not None:
    import os as _os

    _common = dict(deadline=None, derandomize=False, database=None, print_blob=True,
                   suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                          HealthCheck.data_too_large, HealthCheck.filter_too_much])
    _hsettings.register_profile("ci", max_examples=12, **_common)
    _hsettings.register_profile("deep", max_examples=240, **_common)
    _hsettings.load_profile(_os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config):
    global _FUZZ_SEED
    if _hsettings is None:
        return
    import os
    import random

    from hypothesis import core

    given = config.getoption("hypothesis_seed", None) or os.environ.get("XMODAL_FUZZ_SEED")
    _FUZZ_SEED = int(given) if given is not None else random.SystemRandom().randrange(1 << 32)
    core.global_force_seed = _FUZZ_SEED


def pytest_report_header(config):
    if _FUZZ_SEED is not None:
        return f"hypothesis seed: {_FUZZ_SEED} (rerun with --hypothesis-seed={_FUZZ_SEED})"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _FUZZ_SEED is not None and terminalreporter.stats.get("failed"):
        terminalreporter.write_line(f"hypothesis seed of this session: {_FUZZ_SEED} "
                                    f"(rerun with --hypothesis-seed={_FUZZ_SEED})")


def sinkhorn_run_and_gallery(root):
    """A small trained run (linear heads, normalisers none and sinkhorn) under ``root / "run"`` and a
    seeded ``[900, 64]`` gallery of raw features: ``(run folder, gallery.npy)``."""
    import numpy as np

    from xmodal.config import from_dict
    from xmodal.training.loop import train

    cfg = from_dict({
        "data": {"name": "synthetic", "synthetic": {"num_train": 1500, "num_val": 200, "num_test": 200,
                                                     "num_concepts": 20}},
        "model": {"kind": "linear", "dim": 16},
        "loss": {"name": "infonce", "temperature": 0.05},
        "test_time": {"normalizers": ["none", "sinkhorn"], "bank_size": 200, "selection": "best"},
        "train": {"seed": 0, "epochs": 2, "batch_size": 64},
    })
    train(cfg, root / "run", resume=False, progress=False, verbose=False)
    feats = root / "gallery.npy"
    np.save(feats, np.random.default_rng(5).standard_normal((900, 64)).astype(np.float32))
    return root / "run", feats
