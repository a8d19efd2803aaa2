"""The verifier pool a training run grades with: its workers never see the signals that stop the trainer."""

from __future__ import annotations

import signal
from multiprocessing import resource_tracker

from thinkrl.verifier.pool import VerifierPool

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # what asks a run to finish its step, checkpoint and stop


class ShieldedPool(VerifierPool):
    """A VerifierPool whose workers never receive SIGINT/SIGTERM, so stopping is the trainer's decision alone.

    Ctrl-C signals the whole foreground process group, and Slurm or systemd signal every process of a job:
    a worker killed mid-sample would score it 0 (the checkpointed step would differ from an uninterrupted
    run) and one killed while idle breaks the pipe the trainer writes to next. Each worker is spawned while
    this thread blocks the two signals; the blocked mask survives exec, so the worker (and any process a
    grader starts: stop those with kill(), as subprocess's timeout does) never sees them. A signal sent in
    that window is delivered to the trainer once unblocked. Workers still stop on close() or a pipe EOF.
    """

    def __init__(self, *args, **kwargs) -> None:
        self._procs = []
        try:
            super().__init__(*args, **kwargs)
        except BaseException:  # e.g. Ctrl-C twice during start-up: multiprocessing's exit-time SIGTERM
            for proc in self._procs:  # would not stop these workers, and joining them would hang
                proc.kill()
            raise

    def _spawn(self):
        # spawning starts multiprocessing's resource tracker the first time, with this same trick, and then
        # unblocks both signals: start it first, or the first worker would be spawned unshielded
        resource_tracker.ensure_running()
        old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            proc, conn = super()._spawn()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        self._procs.append(proc)
        return proc, conn
