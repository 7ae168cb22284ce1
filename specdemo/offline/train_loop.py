"""What the trainers share: the learning-rate schedule, checkpoints that survive a kill, the run log, the time
budget, held-out numbers per data source, and data parallelism over the processes `accelerate launch` starts.

Both trainers (train_s4c.py, train_sdsat.py) run for a number of optimizer steps or a time budget, whichever ends
first; on a shared 2-core CPU the step rate is unpredictable, so the schedule also follows the clock.
"""
from __future__ import annotations

import math
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from specdemo.offline.sharegpt import split_name

SOURCES = ("sharegpt", "project")  # where a distilled record's prompt came from (its id says which)


def cosine_lr(step: int, lr: float, warmup: int, total_steps: int, min_ratio: float = 0.1,
              budget_spent: float = 0.0) -> float:
    """Linear warmup, then cosine from `lr` down to `min_ratio * lr`.  Progress is the share of steps done or of the
    time budget spent, whichever is further along."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, max((step - warmup) / max(1, total_steps - warmup), budget_spent))
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def seed_everything(seed: int, threads: int = 0) -> None:
    """Seed Python's and torch's generators; `threads` > 0 also fixes torch's thread count."""
    random.seed(seed)
    torch.manual_seed(seed)
    if threads:
        torch.set_num_threads(threads)


def optimizer_step(opt: torch.optim.Optimizer, loss: torch.Tensor | None, lr: float, clip: float = 1.0) -> None:
    """Set the learning rate, back-propagate `loss` (None: the gradients are already there), clip the gradient norm
    (the unrolled heads and the adaptive chains both see occasional spikes) and step."""
    for group in opt.param_groups:
        group["lr"] = lr
    if loss is not None:
        opt.zero_grad(set_to_none=True)
        loss.backward()
    torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], clip)
    opt.step()


@dataclass
class Clock:
    """Wall time of a run across resumes: `minutes` = 0 means no budget."""

    minutes: float = 0.0
    before: float = 0.0  # seconds spent in earlier runs of the same training (from the checkpoint)
    start: float = field(default_factory=time.time)

    def elapsed(self) -> float:
        return self.before + time.time() - self.start

    def spent(self) -> float:
        """Share of the time budget used (0 without a budget)."""
        return min(1.0, self.elapsed() / (60 * self.minutes)) if self.minutes else 0.0

    def over(self) -> bool:
        return bool(self.minutes) and self.elapsed() >= 60 * self.minutes


class DataParallel:
    """Data parallelism over the processes `accelerate launch` starts (one process when run plainly); sharded
    distillation shares its shards out over the same processes.

    Every process draws the same global batch (the same seed, the same order) and computes the loss terms of its
    share; the terms are normalised by the global batch's counts, so summing the processes' gradients gives the
    one-process gradient, and every process then takes the same optimizer step.  Only the main process logs, evaluates
    and writes."""

    def __init__(self) -> None:
        from accelerate import PartialState

        self.state = PartialState(cpu=not torch.cuda.is_available())  # without `cpu`, CPU processes see a world of 1
        self.rank, self.world = self.state.process_index, self.state.num_processes
        self.is_main = self.state.is_main_process

    def device(self, asked: str | None) -> str | None:
        """The device to load on: as asked, else this process's own when there are several (one GPU each)."""
        return asked or (str(self.state.device) if self.world > 1 else None)

    def share(self, batch: list) -> list:
        """This process's share of a global batch (every world-th item)."""
        return batch[self.rank :: self.world]

    def sum_gradients(self, params) -> None:
        """Sum every parameter's gradient over the processes (missing gradients count as zeros)."""
        if self.world == 1:
            return
        from accelerate.utils import reduce

        params = [p for p in params if p.requires_grad]
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
        flat = reduce(flat, reduction="sum")
        for p, g in zip(params, flat.split([p.numel() for p in params])):
            p.grad = g.view_as(p).clone()

    def same_parameters(self, module: torch.nn.Module) -> None:
        """Give every process the main process's parameters (a fresh start is seeded alike, a resume reads the same
        checkpoint; this makes sure)."""
        if self.world == 1:
            return
        from accelerate.utils import broadcast

        with torch.no_grad():
            for p in module.parameters():
                p.copy_(broadcast(p.detach().clone()))

    def any(self, flag: bool) -> bool:
        """True on every process when `flag` is true on any (so that all stop at the same step)."""
        if self.world == 1:
            return flag
        from accelerate.utils import reduce

        flags = torch.tensor([float(flag)], device=self.state.device)  # NCCL reduces CUDA tensors only
        return bool(reduce(flags, reduction="sum").item() > 0)

    def finish(self) -> None:
        """Every process waits for the others, then leaves the process group: a process that exits while its peers
        still hold their connections can die in the group's teardown (SIGABRT in the launch test, once in several
        runs).  Call once on every process, after the last collective."""
        if self.world > 1:
            self.state.wait_for_everyone()
            self.state.destroy_process_group()


def save_checkpoint(path: Path, state: dict) -> None:
    """Write atomically: a kill mid-write leaves the previous checkpoint intact."""
    tmp = Path(str(path) + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: Path) -> dict | None:
    return torch.load(path, weights_only=False) if path.exists() else None


def run_log(log_file: Path | None = None) -> Callable[[str], None]:
    """A logger that timestamps each line to stdout and, when given, appends it to `log_file`."""
    def log(msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        if log_file is not None:
            with open(log_file, "a") as f:
                f.write(line + "\n")
    return log


def command_line() -> str:
    """The command that started this process, as a user would type it again."""
    if sys.argv[0].endswith("__main__.py"):
        return " ".join(["python -m specdemo"] + sys.argv[1:])
    if Path(sys.argv[0]).name == "specdemo":  # the installed console script
        return " ".join(["specdemo"] + sys.argv[1:])
    return " ".join(sys.argv)


def heldout_by_source(held: list[dict], evaluate: Callable[[list[dict]], dict]) -> dict[str, dict]:
    """`evaluate` on the held-out records of each prompt source separately ({"sharegpt": {...}, "project": {...}}),
    so a number says which kind of prompt it was measured on."""
    out = {}
    for name in SOURCES:
        part = [r for r in held if split_name(r["id"]) == name]
        if part:
            out[name] = dict(evaluate(part), records=len(part))
    return out
