"""`dpsynth` as a torchrun worker whose rank $KILL_RANK kills itself (SIGKILL, no clean-up)
when it draws its $KILL_AT-th Poisson batch: a rank lost mid-run
(tests/training/test_distributed.py)."""

from __future__ import annotations

import os
import signal
import sys

from dpsynth.privacy.mechanisms.poisson import PoissonSampler

if os.environ.get("RANK") == os.environ.get("KILL_RANK"):
    _original = PoissonSampler.next
    _drawn = [0]

    def _next_or_die(self: PoissonSampler):
        _drawn[0] += 1
        if _drawn[0] == int(os.environ["KILL_AT"]):
            os.kill(os.getpid(), signal.SIGKILL)
        return _original(self)

    PoissonSampler.next = _next_or_die  # type: ignore[method-assign]

from dpsynth.cli import main

sys.argv = ["dpsynth", *sys.argv[1:]]
main()
