"""Preemption: SIGTERM or SIGINT during a fit writes a checkpoint of the current step and stops.

A scheduler (SLURM, Kubernetes, a reclaimed spot instance) sends SIGTERM some seconds before it
kills a job. The first SIGTERM or SIGINT asks the run to stop at the end of the training step in
progress, once every rank has agreed: ``last.ckpt`` is written for the steps done (atomically, as
every checkpoint; at a validation step, by the validation that follows), and the fit raises
:class:`Preempted`, which ``ktframe fit`` turns into one line and exit code 128 + the signal's
number (143 for SIGTERM, 130 for SIGINT). ``resume=auto`` continues from that step, bit for bit as
the uninterrupted run would have. A second signal exits at once, without that checkpoint (the
previous one is intact).

The handlers are installed for the fit only and the previous ones restored afterwards. Lightning
installs a SIGTERM handler of its own when training starts, which under DDP broadcasts from inside
the handler; ours replaces it for the fit. Lightning's SLURM requeue signal (SIGUSR1) stays its own.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import lightning as L
import torch

SIGNALS = (signal.SIGTERM, signal.SIGINT)


def exit_code(signum: int) -> int:
    """The shell's code for a process ended by ``signum``: what schedulers and scripts expect."""
    return 128 + signum


class Preempted(Exception):
    """The fit stopped on a signal, with a checkpoint of its last step."""

    def __init__(self, signum: int, step: int, checkpoint: Path) -> None:
        super().__init__(signum, step, checkpoint)
        self.signum, self.step, self.checkpoint = signum, step, checkpoint

    def __str__(self) -> str:
        name = signal.Signals(self.signum).name
        return f"stopped by {name} after step {self.step}, checkpoint {self.checkpoint}; continue with resume=auto"


class Preemption(L.Callback):
    """Used as ``with Preemption(last, val_every) as callback: trainer.fit(...)``, with the
    callback in the Trainer's list."""

    def __init__(self, checkpoint: Path, val_every: int) -> None:
        self.checkpoint, self.val_every = checkpoint, val_every
        self.signum = 0  # the first signal received; 0 while none
        self._stop = 0  # the signal every rank has agreed to stop on
        self._previous: dict[int, object] = {}

    def __enter__(self) -> Preemption:
        if threading.current_thread() is threading.main_thread():  # only there can Python take signals
            self._previous = {signum: signal.getsignal(signum) for signum in SIGNALS}
            self._install()
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _install(self) -> None:
        for signum in self._previous:
            signal.signal(signum, self._receive)

    def _receive(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.signum:
            # os.write, not print: the handler may run in the middle of a print to the same stream
            os.write(2, f"ktframe fit: {name} again: exiting at once, without a checkpoint of the current step\n".encode())
            os._exit(exit_code(signum))
        self.signum = signum
        os.write(2, f"ktframe fit: {name}: stopping after this step with a checkpoint (send it again to exit at once)\n".encode())

    def on_train_start(self, trainer: L.Trainer, module) -> None:
        self._install()  # over the SIGTERM handler Lightning installed a moment ago

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        # One collective per step: the largest signal number any rank received, so all stop together.
        signum = int(trainer.strategy.reduce(torch.tensor(self.signum, device=trainer.strategy.root_device), reduce_op="max"))
        if not signum:
            return
        self._stop = signum  # at the next step's start: after this step's logging (and validation)
        if trainer.global_step % self.val_every == 0 or trainer.global_step >= trainer.max_steps:
            return  # a validation follows this step and writes last.ckpt (written here, the
            # checkpoint would tell the resumed run that this validation had been done)
        # Here, at the end of a step, is where Lightning's own step checkpoints are written: a
        # resumed run counts its steps and validations from it as the uninterrupted run does.
        # The whole training state, as a validation's last.ckpt holds it (weights_only said, not
        # left to Lightning's default, whose log line would read like an unsafe load).
        trainer.save_checkpoint(self.checkpoint, weights_only=False)

    def on_train_batch_start(self, trainer: L.Trainer, *args) -> None:
        if self._stop:
            raise Preempted(self._stop, trainer.global_step, self.checkpoint)
