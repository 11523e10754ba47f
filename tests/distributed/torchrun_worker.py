"""The worker that tests start under torchrun: ``marginface`` with the command line given, and
a fault to inject on the group's first attempt only (``TORCHELASTIC_RESTART_COUNT`` = 0).

Environment: ``MARGINFACE_TEST_KILL_RANK`` and ``MARGINFACE_TEST_KILL_STEP``: that rank kills
itself with SIGKILL (as the OOM killer or a lost node would: nothing runs after it) during
that global step (counted from 1). ``MARGINFACE_TEST_MARK_DIR``: each rank creates the file
``rank-<RANK>`` there when it starts its first step (so a test signals only a group that trains).

A command that finished (status 0) or stopped on a signal after its checkpoint must have
destroyed the process group it created (the worker exits 97 otherwise), so every torchrun test
that expects success also checks that.
"""

from __future__ import annotations

import os
import signal
import sys

import torch.distributed as dist

from marginface.cli import main
from marginface.train import Trainer


def _mark_first_step() -> None:
    folder = os.environ.get("MARGINFACE_TEST_MARK_DIR")
    if folder is None:
        return
    original = Trainer._train_step

    def marking(self, *args):
        marker = os.path.join(folder, f"rank-{os.environ.get('RANK', '0')}")
        if not os.path.exists(marker):
            open(marker, "w").close()
        return original(self, *args)

    Trainer._train_step = marking


def _inject_fault() -> None:
    rank, step = (
        os.environ.get("MARGINFACE_TEST_KILL_RANK"),
        os.environ.get("MARGINFACE_TEST_KILL_STEP"),
    )
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    if rank is None or step is None or not first_attempt or os.environ.get("RANK") != rank:
        return
    original = Trainer._train_step

    def dying(self, epoch, step_in_epoch, *args):
        if epoch * self.steps_per_epoch + step_in_epoch + 1 == int(step):
            os.kill(os.getpid(), signal.SIGKILL)
        return original(self, epoch, step_in_epoch, *args)

    Trainer._train_step = dying


if __name__ == "__main__":
    _inject_fault()
    _mark_first_step()
    status = main(sys.argv[1:])
    if status in (0, 143) and dist.is_initialized():
        print("marginface left its process group initialized", file=sys.stderr)
        status = 97
    sys.exit(status)
