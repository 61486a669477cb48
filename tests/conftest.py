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
