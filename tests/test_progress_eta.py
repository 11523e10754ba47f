"""The run's ETA counts the evaluations still to come (issue 40: it said 0:00:00 with nine
minutes of verification left): a fake clock drives ProgressReporter."""

from __future__ import annotations

import logging
import re

from marginface._progress import FORWARD_ONLY_SPEEDUP, ProgressReporter
from marginface.train import Trainer
from marginface.train.config import TrainConfig

ETA = re.compile(r"epoch (\d+)/\d+  step (\d+)/\d+  .*  eta (\S+) \(run (\S+)\)$")


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def etas(caplog) -> list[tuple[int, int, str, str]]:
    found = [ETA.search(r.getMessage()) for r in caplog.records if r.name.endswith("progress")]
    assert all(found), [r.getMessage() for r in caplog.records]
    return [(int(m[1]), int(m[2]), m[3], m[4]) for m in found]


def train(reporter: ProgressReporter, clock: FakeClock, *, step_seconds: float, evaluation) -> None:
    """Every step takes ``step_seconds``; after epoch ``e`` (and step ``s``) the evaluation
    takes ``evaluation(kind, e, s)`` seconds (None: no evaluation), reported as the trainer
    does."""
    spe = reporter.steps_per_epoch
    for epoch in range(reporter.epochs):
        progress = reporter.epoch(epoch)
        for step in range(spe):
            clock.now += step_seconds
            seconds = evaluation("step", epoch, step)
            if seconds is not None:
                clock.now += seconds
                reporter.evaluated("step", seconds)
            progress.update(step, loss=1.0, mean_loss=1.0, images=8 * (step + 1))
        progress.close()
        clock.now += evaluation("epoch", epoch, spe)
        reporter.evaluated("epoch", evaluation("epoch", epoch, spe))


def test_the_last_step_leaves_the_last_evaluation_in_the_eta(caplog) -> None:
    caplog.set_level(logging.INFO, logger="marginface.train.progress")
    clock = FakeClock()
    reporter = ProgressReporter("lines", epochs=2, steps_per_epoch=4, interval=0, clock=clock)
    train(
        reporter,
        clock,
        step_seconds=1.0,
        evaluation=lambda kind, e, s: 540.0 if kind == "epoch" else None,
    )
    found = etas(caplog)
    # epoch 1: nothing measured, no images to guess from: the steps alone
    assert found[3] == (1, 4, "0:00:00", "0:00:04")
    # epoch 2, step 1: 1 s per training step (the 540 s evaluation left out), 3 steps and
    # one evaluation of 540 s (the last one measured) to go
    assert found[4] == (2, 1, "0:09:03", "0:09:03")
    # the last step: the run's last evaluation is still to come (was "0:00:00")
    assert found[7] == (2, 4, "0:09:00", "0:09:00")


def test_before_the_first_evaluation_its_images_give_the_guess(caplog) -> None:
    caplog.set_level(logging.INFO, logger="marginface.train.progress")
    clock = FakeClock()
    reporter = ProgressReporter(
        "lines", epochs=2, steps_per_epoch=4, interval=0, evaluation_images=3000, clock=clock
    )
    train(
        reporter, clock, step_seconds=1.0, evaluation=lambda k, e, s: 0.0 if k == "epoch" else None
    )
    # 8 training images per 1-s step: the evaluation embeds at 3 x 8 images/s
    guess = 3000 / (FORWARD_ONLY_SPEEDUP * 8)  # 125 s
    assert guess == 125.0
    first = etas(caplog)[0]  # 1 step done: 3 steps, this epoch's evaluation, the next epoch
    assert first == (1, 1, "0:02:08", "0:04:17")  # 3 + 125; 7 + 2 x 125


def test_verifications_every_n_steps_count_too(caplog) -> None:
    caplog.set_level(logging.INFO, logger="marginface.train.progress")
    clock = FakeClock()
    reporter = ProgressReporter(
        "lines", epochs=2, steps_per_epoch=4, interval=0, verify_every=2, clock=clock
    )

    def evaluation(kind: str, epoch: int, step: int) -> float | None:
        if kind == "epoch":
            return 20.0
        return 5.0 if (epoch * 4 + step + 1) % 2 == 0 else None

    train(reporter, clock, step_seconds=1.0, evaluation=evaluation)
    found = etas(caplog)
    # after global step 3 (5 s verification measured at step 2): steps 4..8 hold three
    # verifications (4, 6, 8), one of them in this epoch; the epoch evaluation not yet measured
    assert found[2] == (1, 3, "0:00:06", "0:00:20")  # 1 + 5; 5 + 3 x 5
    # after global step 5 (epoch 1's 20 s evaluation measured): 3 steps, verifications 6 and
    # 8, this epoch's evaluation
    assert found[4] == (2, 1, "0:00:33", "0:00:33")  # 3 + 2 x 5 + 20


def test_a_resumed_run_counts_only_its_own_steps(caplog) -> None:
    caplog.set_level(logging.INFO, logger="marginface.train.progress")
    clock = FakeClock()
    reporter = ProgressReporter(
        "lines", epochs=3, steps_per_epoch=2, start_epoch=2, interval=0, clock=clock
    )
    progress = reporter.epoch(2)
    clock.now = 2.0
    progress.update(0, loss=1.0, mean_loss=1.0, images=8)
    assert etas(caplog) == [(3, 1, "0:00:02", "0:00:02")]


def test_a_step_checkpoint_resumed_mid_epoch_counts_from_its_step(caplog) -> None:
    caplog.set_level(logging.INFO, logger="marginface.train.progress")
    clock = FakeClock()
    reporter = ProgressReporter(
        "lines", epochs=2, steps_per_epoch=10, start_epoch=1, interval=0, clock=clock
    )
    progress = reporter.epoch(1)
    for step in (6, 7):  # steps 0..5 of epoch 2 were trained before the resume
        clock.now += 2.0
        progress.update(step, loss=1.0, mean_loss=1.0, images=8)
    # 2 s per step over the two steps trained here, 2 steps left
    assert etas(caplog)[-1] == (2, 8, "0:00:04", "0:00:04")


def test_the_trainer_reports_each_evaluation(tmp_path, monkeypatch) -> None:
    seen: list[tuple[str, float]] = []
    made: list[ProgressReporter] = []
    original = ProgressReporter.evaluated

    def spy(self, kind, seconds):
        made.append(self)
        seen.append((kind, seconds))
        original(self, kind, seconds)

    monkeypatch.setattr(ProgressReporter, "evaluated", spy)
    config = TrainConfig(limit=128, epochs=2, batch_size=64, threads=1, loss="arcface")
    trainer = Trainer(config, tmp_path / "run", progress="lines")
    trainer.fit()
    assert [kind for kind, _ in seen] == ["epoch", "epoch"]
    assert all(seconds > 0 for _, seconds in seen)
    # the guess before the first evaluation: the digits' test images, embedded once (no flip)
    assert made[0].images == {"epoch": len(trainer.bundle.test), "step": 0}
