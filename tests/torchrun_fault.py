"""``python -m transformer_lab`` with one rank that dies: used by tests/test_distributed.py under torchrun.

``DIE_RANK`` and ``DIE_STEP`` (environment): that rank exits with status 3, as a crashed or killed process
would, when it is about to take step ``DIE_STEP``.
"""

import os
import sys

from transformer_lab import train
from transformer_lab.cli import main

DIE_RANK, DIE_STEP = int(os.environ["DIE_RANK"]), int(os.environ["DIE_STEP"])
_step = train.Trainer.train_step


def _dying_step(self, x, y):
    if self.world.rank == DIE_RANK and self.step == DIE_STEP:
        os._exit(3)
    return _step(self, x, y)


train.Trainer.train_step = _dying_step
sys.exit(main(sys.argv[1:]))
