"""The library tour of docs/getting-started.md (examples/tour.py) runs as documented."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_tour_runs_and_streaming_equals_dense():
    # The script asserts that the streamed metrics equal the dense ones; a failure exits non-zero.
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "tour.py")], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    assert "with train-bank Sinkhorn biases" in out.stdout
