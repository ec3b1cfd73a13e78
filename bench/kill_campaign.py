"""Kill campaign: interrupt a tiny training run again and again, resume it every time, and check that the
finished run is the one an uninterrupted run gives.

    python bench/kill_campaign.py                           # full form: 24 SIGKILLs + 6 SIGINT/SIGTERM, seed 0
    python bench/kill_campaign.py --kills 2 --graceful 2    # the short form CI runs (tests/test_faults.py)

The run: the tiny shapes dataset (24 train / 8 val images), yolov5n, imgsz 64, batch 8, workers 0, bf16.
Each kill targets an epoch (kills are spread evenly over the epochs) and a moment drawn from a seeded
generator:
    startup  a random delay after the process starts (imports, set-up, the first batches)
    epoch    a random moment of the target epoch (training, validation or saving)
    write    while a checkpoint is being written: the run has AMPYOLO_FAULTS=slow_save, which holds each
             temp file open before its rename, and the kill lands in that window
SIGKILLs cycle through the three moments; the --graceful interruptions (SIGINT and SIGTERM in turn, at
an epoch or write moment) must end the run cleanly: exit 0 or 130, no traceback. All are shuffled.
After each kill: last.pt must load (weights_only) and hold a resumable training state that never goes
backwards, best.pt must load, and no half-written temp file may survive the next start. The next process
continues with --resume. At the end the final FP32 EMA and results.csv are compared with an uninterrupted
run of the same options (max abs difference <= 1e-6, rows equal).
"""
from __future__ import annotations

import argparse
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

import train  # noqa: E402
from utils.data.synthetic import tiny_shapes  # noqa: E402
from utils.engine.checkpoint import load_checkpoint  # noqa: E402
from utils.options import to_argv  # noqa: E402
from utils.report.results import read_rows  # noqa: E402

ARGS = dict(imgsz=64, batch_size=8, workers=0, noplots=True, amp="bf16", seed=3)
PHASES = ("write", "epoch", "startup")
SIGNALS = {"KILL": signal.SIGKILL, "INT": signal.SIGINT, "TERM": signal.SIGTERM}
SLOW_SAVE_S = 0.4
WAIT_S = 300  # any single wait longer than this is a hang: the campaign fails


@dataclass
class Kill:
    n: int
    signal: str
    phase: str
    target_epoch: int
    rc: int | None = None
    last_epoch: int | None = None  # completed_epoch in last.pt after the kill
    stale_temp: bool = False  # a half-written temp file was left (removed by the next start)
    problem: str = ""


@dataclass
class Report:
    kills: list[Kill] = field(default_factory=list)
    max_abs_diff: float = float("nan")
    rows_equal: bool = False
    best_equal: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return (not any(k.problem for k in self.kills) and self.max_abs_diff <= 1e-6 and self.rows_equal
                and self.best_equal)

    HEADER = f"{'#':>3} {'signal':<6} {'moment':<13} {'epoch':>5} {'rc':>4} {'last.pt':>7} {'temp':>5}  result"

    @staticmethod
    def row(k: Kill) -> str:
        return (f"{k.n:>3} {k.signal:<6} {k.phase:<13} {k.target_epoch:>5} {str(k.rc):>4} {str(k.last_epoch):>7} "
                f"{'left' if k.stale_temp else '-':>5}  {k.problem or 'ok'}")

    def table(self) -> str:
        lines = [self.HEADER, *map(self.row, self.kills)]
        lines.append(f"final EMA max |diff| vs uninterrupted: {self.max_abs_diff:.3g}; results.csv rows equal: "
                     f"{self.rows_equal}; best.pt equal: {self.best_equal}; {self.seconds:.0f}s")
        return "\n".join(lines)


class Child:
    """One train.py process whose stdout lines are collected by a thread (so waiting never blocks it)."""

    def __init__(self, cmd: list[str]):
        # the same thread count as this process: its reference run must do the same arithmetic
        env = {**os.environ, "AMPYOLO_FAULTS": f"slow_save@{SLOW_SAVE_S}", "OMP_NUM_THREADS": str(torch.get_num_threads())}
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self._line), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, self.stderr.append), daemon=True).start()

    def _line(self, line: str) -> None:
        self.stdout.append(line)
        self.lines.put(line)

    @staticmethod
    def _pump(stream, sink) -> None:
        for line in stream:
            sink(line)

    def wait_for(self, text: str, within: float | None = None) -> bool:
        """Wait until a stdout line contains `text`; False if the process ended first or, with `within`,
        once that many seconds have passed (without it, a wait of WAIT_S is a hang)."""
        deadline = time.time() + (WAIT_S if within is None else within)
        while time.time() < deadline:
            try:
                if text in self.lines.get(timeout=0.05):
                    return True
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    return False
        if within is not None:
            return False
        raise TimeoutError(f"no '{text}' within {WAIT_S}s: the run hangs")

    def alive(self) -> bool:
        return self.proc.poll() is None


def wait_for_temp(weights: Path, child: Child) -> str:
    """Wait until a checkpoint temp file (.last.pt.*.tmp / .best.pt.*.tmp) exists; the file it will become."""
    deadline = time.time() + WAIT_S
    while time.time() < deadline and child.alive():
        temps = list(weights.glob(".*.pt.*.tmp"))
        if temps:
            return temps[0].name.split(".")[1] + ".pt"
        time.sleep(0.002)
    return ""


def strike(child: Child, kill: Kill, weights: Path, start_epoch: int, rng: random.Random, epoch_s: float) -> bool:
    """Bring the child to the chosen moment and send the signal; False if it finished first."""
    if kill.phase == "startup":  # a random moment of start-up, cut short when the epochs begin
        child.wait_for("training ", within=rng.uniform(0.5, 6.0))
    else:
        if not child.wait_for("training "):  # set-up done: the epoch loop starts
            return False
        for e in range(start_epoch, kill.target_epoch):  # let it finish the epochs before the target
            if not child.wait_for(f"epoch {e} done"):
                return False
        if kill.phase == "epoch":  # a random moment of the target epoch, cut short when it ends
            child.wait_for(f"epoch {kill.target_epoch} done", within=rng.uniform(0.0, epoch_s))
        else:
            target = wait_for_temp(weights, child)
            if not target:
                return False
            kill.phase = f"write {target}"
            time.sleep(rng.uniform(0.0, SLOW_SAVE_S * 0.9))
    if not child.alive():
        return False
    child.proc.send_signal(SIGNALS[kill.signal])
    return True


def check_after(kill: Kill, child: Child, weights: Path, previous_epoch: int | None) -> None:
    """What must hold after any kill: loadable, resumable checkpoints, clean exits for INT/TERM."""
    err, out = "".join(child.stderr), "".join(child.stdout)
    if kill.signal != "KILL" and (kill.rc not in (0, 130) or "Traceback" in err + out or "interrupted" not in err + out):
        kill.problem = f"unclean exit {kill.rc}: {err.strip().splitlines()[-1:]}"
        return
    kill.stale_temp = any(weights.glob(".*.pt.*.tmp"))
    if not (weights / "last.pt").exists():
        if previous_epoch is not None:
            kill.problem = "last.pt disappeared"
        return
    try:
        ckpt = load_checkpoint(weights / "last.pt")
        if (weights / "best.pt").exists():
            load_checkpoint(weights / "best.pt")
    except Exception as e:  # noqa: BLE001 -- any failure to load is the finding
        kill.problem = f"checkpoint does not load: {e}"
        return
    if "train" not in ckpt:
        kill.problem = "last.pt was stripped although the run did not finish"
        return
    kill.last_epoch = ckpt["train"]["completed_epoch"]
    if previous_epoch is not None and kill.last_epoch < previous_epoch:
        kill.problem = f"last.pt went back from epoch {previous_epoch} to {kill.last_epoch}"


def plan(kills: int, graceful: int, epochs: int, rng: random.Random) -> list[Kill]:
    """SIGKILLs through the phases in turn, SIGINT/SIGTERM alternating (at epoch or write moments: their
    handler is installed by then), shuffled; targets spread evenly over all epochs but the last (a kill
    aimed at the last one could come after the run finished)."""
    moves = [("KILL", PHASES[n % 3]) for n in range(kills)]
    moves += [(("INT", "TERM")[n % 2], PHASES[n % 2]) for n in range(graceful)]
    rng.shuffle(moves)
    total = len(moves)
    return [Kill(n + 1, sig, phase, n * max(epochs - 1, 1) // total) for n, (sig, phase) in enumerate(moves)]


def campaign(data: Path, workdir: Path, kills: int, graceful: int = 0, epochs: int = 6, seed: int = 0,
             reference: train.Outcome | None = None, log=print) -> Report:
    t_start = time.time()
    rng = random.Random(seed)
    args = {**ARGS, "epochs": epochs}
    report = Report()
    if reference is None:
        t0 = time.time()
        reference = train.run(data=str(data), project=str(workdir / "reference"), **args)
        log(f"uninterrupted reference: {time.time() - t0:.0f}s")
    epoch_s = _seconds_per_epoch(reference.save_dir)
    run_dir = workdir / "killed" / "exp"
    weights = run_dir / "weights"
    fresh = [sys.executable, "train.py", "--data", str(data), "--project", str(workdir / "killed"), "--exist-ok", *to_argv(args)]
    previous = None
    for kill in plan(kills, graceful, epochs, rng):
        resume = (weights / "last.pt").exists()
        child = Child([sys.executable, "train.py", "--resume", str(weights / "last.pt"), "--workers", "0"] if resume else fresh)
        start_epoch = 0 if previous is None else previous + 1
        struck = strike(child, kill, weights, start_epoch, rng, epoch_s)
        kill.rc = child.proc.wait(timeout=WAIT_S)
        if not struck:
            kill.problem = "the run finished before the kill"
        else:
            check_after(kill, child, weights, previous)
        previous = kill.last_epoch if kill.last_epoch is not None else previous
        report.kills.append(kill)
        log((Report.HEADER + "\n" if kill.n == 1 else "") + Report.row(kill))
        if kill.problem:
            break
    final = train.run(resume=str(weights / "last.pt"), workers=0)
    a, b = reference.ema.state_dict(), final.ema.state_dict()
    report.max_abs_diff = max((a[k].double() - b[k].double()).abs().max().item() for k in a)
    report.rows_equal = (read_rows(reference.save_dir / "results.csv", clock=False)
                         == read_rows(final.save_dir / "results.csv", clock=False))
    report.best_equal = _same_weights(reference.save_dir / "weights" / "best.pt", final.save_dir / "weights" / "best.pt")
    report.seconds = time.time() - t_start
    return report


def _same_weights(a: Path, b: Path) -> bool:
    ca, cb = load_checkpoint(a), load_checkpoint(b)
    return ca["epoch"] == cb["epoch"] and all(torch.equal(ca["model"][k], cb["model"][k]) for k in ca["model"])


def _seconds_per_epoch(save_dir: Path) -> float:
    st = (save_dir / "results.csv").stat()
    rows = len(read_rows(save_dir / "results.csv")) - 1
    started = (save_dir / "opt.yaml").stat().st_mtime
    return (st.st_mtime - started) / max(rows, 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=24, help="SIGKILLs")
    p.add_argument("--graceful", type=int, default=6, help="SIGINT/SIGTERM interruptions, besides the kills")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default="", help="default: a new temporary folder")
    p.add_argument("--data", default="", help="data YAML (default: a tiny copy of the built-in shapes dataset)")
    p.add_argument("--threads", type=int, default=1, help="torch threads here and in every child (two OpenMP "
                                                           "threads on shared cores make a tiny run much slower)")
    opt = p.parse_args()
    torch.set_num_threads(opt.threads)
    import tempfile

    workdir = Path(opt.workdir or tempfile.mkdtemp(prefix="kill_campaign_"))
    data = Path(opt.data) if opt.data else tiny_shapes(workdir / "data")
    report = campaign(data, workdir, opt.kills, opt.graceful, opt.epochs, opt.seed)
    print(report.table())
    done = report.ok and len(report.kills) == opt.kills + opt.graceful
    print("PASS" if done else "FAIL")
    sys.exit(0 if done else 1)


if __name__ == "__main__":
    main()
