"""Long runs at scale (issue 34.5-6): a training process killed with SIGKILL inside its epoch and resumed
from the mid-epoch checkpoint ends with the weights of an uninterrupted run; the progress lines a run
prints without a terminal; ``xmodal data check``'s peak memory.

    .venv/bin/python bench/long_runs.py --videos 1000000 --root /tmp/xmodal_scale [--only check,resume]

On the seeded float16 layout of ``bench/scale.py`` (``ROOT/n{videos}/data``, generated when missing) and
its training recipe (``configs/scale/linear_1m.yaml``, one epoch, CPU):

1. **check**: ``xmodal data check`` as a child process: peak anonymous memory (RssAnon + RssShmem, sampled
   every 20 ms; pages of memory-mapped files are page cache and not counted) and peak RSS (with them).
2. **resume**: the recipe trained uninterrupted (``train.checkpoint_minutes`` 0, so nothing is written inside
   the epoch), then again with ``--checkpoint-minutes M``: once its stderr shows a mid-epoch checkpoint and
   ``--kill-after`` seconds more have passed, the process gets SIGKILL; the same command resumes it. Printed:
   where the checkpoint and the kill were, each process's peak anonymous memory and wall time, whether
   ``model.pt`` and ``checkpoint.pt`` of the resumed run equal the uninterrupted run's bit for bit, and the
   progress lines each process printed (stderr is a file: no terminal), with the seconds between them.

Wall times depend on whatever else the machine runs; nothing here is asserted (``tests/test_midepoch_resume.py``
checks the same property at CI size).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import scale  # noqa: E402  (the layout generator and the process-tree memory sampler)

XMODAL = str(Path(sys.executable).parent / "xmodal")


SRC = str(HERE.parent / "src")  # --src: the xmodal sources the child processes run (e.g. another checkout)


def _env(threads: int) -> dict:
    return dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONPATH=SRC)


def check_section(data: Path, work: Path, results: dict) -> None:
    r = scale.run_measured([XMODAL, "data", "check", str(data)], env=_env(1), log=work / "check.log")
    size = sum(p.stat().st_size for p in data.glob("*.npy"))
    results["check"] = {"peak_anon": r["peak_anon"], "peak_rss": r["peak_rss"], "wall_s": r["wall_s"],
                        "layout_bytes": size}
    print(f"\n## xmodal data check ({scale.mb(size)} float16 layout)\n")
    print(f"peak anon {scale.mb(r['peak_anon'])}, peak RSS (incl. file pages) {scale.mb(r['peak_rss'])}, "
          f"{r['wall_s']:.0f} s")


def _train_cmd(config: Path, out: Path, threads: int) -> list[str]:
    return [XMODAL, "train", str(config), "--out", str(out), "--threads", str(threads), "--no-plots"]


def _progress_lines(log: Path) -> list[str]:
    return [x for x in log.read_text().splitlines() if x.startswith("train: ")]


def _killed_run(config: Path, out: Path, threads: int, kill_after: float, log: Path) -> dict:
    """Train until a checkpoint inside the epoch is reported, wait ``kill_after`` s, SIGKILL."""
    start = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen(_train_cmd(config, out, threads), env=_env(threads), stdout=f, stderr=subprocess.STDOUT)
    sampler = scale.Sampler(proc.pid)
    sampler.start()
    seen = None
    while proc.poll() is None:
        if seen is None and any("train: checkpoint at epoch" in x for x in _progress_lines(log)):
            seen = time.perf_counter()
        if seen is not None and time.perf_counter() - seen >= kill_after:
            os.kill(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.2)
    rc = proc.wait()
    sampler.stop()
    if rc != -signal.SIGKILL:
        raise SystemExit(f"the run ended ({rc}) before a checkpoint inside the epoch: lower --checkpoint-minutes\n"
                         + log.read_text()[-3000:])
    return {"peak_anon": sampler.peak_anon, "wall_s": time.perf_counter() - start, "rc": rc}


def _same(a: Path, b: Path) -> tuple[bool, float]:
    import torch

    wa = torch.load(a, weights_only=True)["model"]["state_dict"]
    wb = torch.load(b, weights_only=True)["model"]["state_dict"]
    diff = max(float((wa[k].double() - wb[k].double()).abs().max()) for k in wa)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa), diff


def _gaps(log: Path) -> list[float]:
    """Seconds between the epoch's progress lines, from their 'N s elapsed' fields."""
    import re

    times = [_seconds(m[1]) for x in _progress_lines(log)
             if (m := re.search(r"batches .*?, ((?:\d+ h )?(?:\d+ min )?\d+ s) elapsed", x))]
    return [b - a for a, b in zip(times, times[1:])]


def _seconds(text: str) -> int:
    parts = text.replace(" h ", "h ").replace(" min ", "m ").replace(" s", "s").split()
    return sum(int(p[:-1]) * {"h": 3600, "m": 60, "s": 1}[p[-1]] for p in parts)


def resume_section(data: Path, work: Path, args: argparse.Namespace, results: dict) -> None:
    import torch

    cfg_full, cfg_kill = work / "recipe_full.yaml", work / "recipe_kill.yaml"
    scale.write_config(cfg_full, data, args.batch, 1, 0, args.bank)
    scale.write_config(cfg_kill, data, args.batch, 1, 0, args.bank)
    import yaml

    for path, minutes in ((cfg_full, 0), (cfg_kill, args.checkpoint_minutes)):
        d = yaml.safe_load(path.read_text())
        d["train"]["checkpoint_minutes"] = minutes
        path.write_text(yaml.safe_dump(d, sort_keys=False))
    full_dir, kill_dir = work / "run_full", work / "run_killed"
    for d in (full_dir, kill_dir):
        shutil.rmtree(d, ignore_errors=True)
    # the resumed run reads the config of the killed one: checkpoint_minutes may differ between a run and
    # its resume, nothing else
    full = scale.run_measured(_train_cmd(cfg_full, full_dir, args.threads), env=_env(args.threads),
                              log=work / "train_full.log")
    killed = _killed_run(cfg_kill, kill_dir, args.threads, args.kill_after, work / "train_killed.log")
    ck = torch.load(kill_dir / "checkpoint.pt", weights_only=True)["state"]
    resumed = scale.run_measured(_train_cmd(cfg_kill, kill_dir, args.threads), env=_env(args.threads),
                                 log=work / "train_resumed.log")
    same, diff = _same(full_dir / "model.pt", kill_dir / "model.pt")
    same_ck, _ = _same(full_dir / "checkpoint.pt", kill_dir / "checkpoint.pt")
    steps = args.videos // args.batch
    logs = {name: _progress_lines(work / f"train_{name}.log") for name in ("full", "killed", "resumed")}
    results["resume"] = {
        "steps_per_epoch": steps, "checkpoint_batch": ck.get("batch"), "checkpoint_step": ck["step"],
        "full": {k: full[k] for k in ("peak_anon", "peak_rss", "wall_s")},
        "killed": killed, "resumed": {k: resumed[k] for k in ("peak_anon", "peak_rss", "wall_s")},
        "model_identical": same, "checkpoint_identical": same_ck, "max_abs_diff": diff,
        "progress_lines": {k: len(v) for k, v in logs.items()}, "line_gaps_s": _gaps(work / "train_full.log")}
    r = results["resume"]
    print(f"\n## Kill inside the epoch and resume ({args.videos:,} clips, batch {args.batch}, {steps:,} steps, "
          f"--threads {args.threads}, checkpoint_minutes {args.checkpoint_minutes})\n")
    print("| run | peak anon | wall | progress lines on stderr |")
    print("| --- | ---: | ---: | ---: |")
    print(f"| uninterrupted | {scale.mb(full['peak_anon'])} | {full['wall_s']:.0f} s | {len(logs['full'])} |")
    print(f"| killed (SIGKILL {args.kill_after:g} s after its first mid-epoch checkpoint) | "
          f"{scale.mb(killed['peak_anon'])} | {killed['wall_s']:.0f} s | {len(logs['killed'])} |")
    print(f"| resumed from batch {ck.get('batch'):,} of {steps:,} | {scale.mb(resumed['peak_anon'])} | "
          f"{resumed['wall_s']:.0f} s | {len(logs['resumed'])} |")
    print(f"\nmodel.pt bit-identical to the uninterrupted run's: {same} (max |difference| {diff:.1e}); "
          f"checkpoint.pt weights identical: {same_ck}")
    gaps = r["line_gaps_s"]
    if gaps:
        print(f"seconds between the epoch's progress lines (uninterrupted run): {min(gaps)}-{max(gaps)}")
    print("\nprogress lines of the uninterrupted run (stderr redirected to a file):")
    for line in logs["full"]:
        print(f"    {line}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--videos", type=int, default=1_000_000, help="clips in the train split")
    p.add_argument("--root", default="/tmp/xmodal_scale", help="work folder (bench/scale.py's layout is reused)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--bank", type=int, default=2000)
    p.add_argument("--checkpoint-minutes", type=float, default=0.25,
                   help="train.checkpoint_minutes of the run that is killed")
    p.add_argument("--kill-after", type=float, default=5.0,
                   help="seconds between the first mid-epoch checkpoint line and the SIGKILL")
    p.add_argument("--only", default="check,resume")
    p.add_argument("--src", default=None, help="run the xmodal of this source folder (default: this checkout's "
                   "src), e.g. an older checkout for a before/after comparison")
    p.add_argument("--json", default=None, help="also write the numbers here")
    args = p.parse_args(argv)
    global SRC
    SRC = str(Path(args.src).resolve()) if args.src else SRC
    work = Path(args.root) / f"n{args.videos}"
    data = work / "data"
    t0 = time.perf_counter()
    sizes = scale.make_layout(data, args.videos, gallery=False)
    print(f"layout {data}: {sizes} ({time.perf_counter() - t0:.0f} s); machine load {os.getloadavg()[0]:.1f}; "
          f"xmodal from {SRC}")
    results: dict = {"videos": args.videos, "threads": args.threads, "load": os.getloadavg()}
    only = set(args.only.split(","))
    if "check" in only:
        check_section(data, work, results)
    if "resume" in only:
        resume_section(data, work, args, results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
