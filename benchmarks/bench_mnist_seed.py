"""The seed's MNIST experiment with our trainer: seconds per epoch and test accuracy per epoch.

Seed 000: the seeds' CNN, 3-D embedding, CurricularFace s=30 m=0.5, batch 1024, Adam (lr 1e-3,
Keras' default) with an L2 penalty of 1e-5 on the conv kernels (here: Adam weight decay 2e-5,
the same gradient 2·1e-5·w, applied to every parameter). The seed reports 99.31% after 200
epochs; its TensorFlow code takes ~17.5 s per epoch on the project's 2-core machine.

``--recipe best`` is ``examples/mnist_best.toml``, read from that file (one source of truth):
BatchNorm backbone with an extra dense layer of 256 before the 3-D embedding, dropout 0.1, Adam
lr 3e-3 with one warm-up epoch and a cosine schedule, batch 256, random affine augmentation
(shift <= 2 px, rotation <= 10°, zoom ±10 %), bf16 autocast. ``--recipe seed`` is
``examples/mnist_seed.toml``. The command line overrides the epochs, seed, threads and, when
given, amp (default: the recipe's own), lr, dropout, the dense layer and the augmentation.

Usage (from the repository root)::

    python benchmarks/bench_mnist_seed.py --epochs 3                  # the seed's recipe, fp32
    python benchmarks/bench_mnist_seed.py --epochs 3 --amp bf16       # bf16 autocast on CPU
    python benchmarks/bench_mnist_seed.py --recipe best --epochs 10 --seeds 0 1 2   # bf16

Prints one line per epoch and a summary with the median training seconds per epoch; writes
``benchmarks/results/mnist_<recipe><tag>_<amp>_seed<k>.csv`` (the trainer's history; the folder
is git-ignored: the tables in docs/benchmarks.md are copied from such files).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import tempfile
from pathlib import Path

import torch

from marginface.train import Trainer
from marginface.train.config import TrainConfig, load_config

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO / ".." / "shared" / "data"


RECIPES = {
    "seed": REPO / "examples" / "mnist_seed.toml",
    "best": REPO / "examples" / "mnist_best.toml",
}
"""The recipes, as the example configurations the README gives to ``marginface train``."""


def recipe(
    name: str,
    *,
    epochs: int,
    seed: int,
    amp: str | None = None,
    threads: int | None = None,
    augment: dict[str, float] | None = None,
    lr: float | None = None,
    dropout: float | None = None,
    hidden: int | None = None,
) -> TrainConfig:
    """The configuration of recipe ``name`` (``RECIPES``) with the command line's overrides.

    None leaves the recipe's value; ``hidden=0`` removes the extra dense layer; ``augment={}``
    turns the augmentation off. MNIST is read from disk only (``download = false``).
    """
    if name not in RECIPES:
        raise ValueError(f"recipe must be one of {', '.join(RECIPES)}, got {name!r}")
    base = load_config(RECIPES[name])
    model_options = dict(base.model_options)
    if dropout is not None:
        model_options["dropout"] = dropout
    if hidden == 0:
        model_options.pop("hidden", None)
    elif hidden is not None:
        model_options["hidden"] = hidden
    overrides = {
        "epochs": epochs,
        "seed": seed,
        "amp": amp,
        "threads": threads,
        "lr": lr,
        "augment": augment,
        "model_options": model_options,
        "dataset_options": {**base.dataset_options, "download": False},
    }
    return load_config(RECIPES[name], overrides)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", choices=("seed", "best"), default="seed")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument(
        "--amp",
        choices=("none", "bf16"),
        default=None,
        help="autocast (default: the recipe's own: none for seed, bf16 for best)",
    )
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--augment",
        nargs="*",
        metavar="KEY=VALUE",
        default=None,
        help="override the recipe's augmentation (no values: none)",
    )
    parser.add_argument("--lr", type=float, default=None, help="override the recipe's lr")
    parser.add_argument("--dropout", type=float, default=None, help="override its dropout")
    parser.add_argument(
        "--hidden", type=int, default=None, help="override the extra dense layer (0: none)"
    )
    parser.add_argument("--tag", default="", help="suffix of the result file name")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    args = parser.parse_args()
    if not (args.data_dir / "mnist").is_dir():
        raise SystemExit(f"MNIST not found under {args.data_dir}/mnist (pass --data-dir)")
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"torch {torch.__version__}, threads {args.threads or torch.get_num_threads()}, "
        f"load average {os.getloadavg()[0]:.2f} (time only below ~1.5)"
    )
    results = Path(__file__).parent / "results"
    results.mkdir(exist_ok=True)
    for seed in args.seeds:
        augment = None
        if args.augment is not None:
            augment = {k: float(v) for k, _, v in (item.partition("=") for item in args.augment)}
        config = recipe(
            args.recipe,
            epochs=args.epochs,
            seed=seed,
            amp=args.amp,
            threads=args.threads,
            augment=augment,
            lr=args.lr,
            dropout=args.dropout,
            hidden=args.hidden,
        )
        config.data_dir = str(args.data_dir)
        run_dir = Path(tempfile.mkdtemp(prefix="bench-mnist-"))

        def show(row: dict, seed: int = seed) -> None:
            print(
                f"seed {seed} epoch {row['epoch']:3d}: train {row['seconds']:6.1f} s  "
                f"loss {row['loss']:.4f}  val_loss {row['val_loss']:.4f}  "
                f"t {row.get('t', float('nan')):.4f}  accuracy {row['accuracy']:.4f}",
                flush=True,
            )

        trainer = Trainer(config, run_dir, callbacks=[show])
        history = trainer.fit(overwrite=True)
        name = f"mnist_{args.recipe}{args.tag}_{config.amp}_seed{seed}.csv"
        shutil.copy(run_dir / "history.csv", results / name)
        shutil.rmtree(run_dir)
        seconds = [row["seconds"] for row in history]
        best = max(row["accuracy"] for row in history)
        first = next((row["epoch"] for row in history if row["accuracy"] >= 0.994), None)
        print(
            f"summary recipe={args.recipe} amp={config.amp} seed={seed}: median train "
            f"{statistics.median(seconds):.1f} s/epoch over {len(seconds)} epochs; final "
            f"accuracy {history[-1]['accuracy']:.4f}, best {best:.4f}; first epoch >= 99.4%: "
            f"{first}; load average {os.getloadavg()[0]:.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
