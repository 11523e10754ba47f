"""The folder layout of a training run: every name a run folder holds, in one place.

::

    RUN/
      config.toml              CONFIG_NAME: the resolved configuration (TOML)
      history.csv              HISTORY_NAME: one row per epoch
      verification.csv         VERIFICATION_NAME: the verification sets every verify_every steps
      checkpoint.pt            CHECKPOINT_NAME: the newest checkpoint, from one process
      checkpoint/              SHARDED_CHECKPOINT_NAME: ... or from several (DCP shards,
        marginface.json          SIDECAR_NAME: epoch, configuration, history, optimizer
        .metadata                INDEX_NAME: DCP's index of the tensors)
      .checkpoint.old/         REPLACED_SHARDED_NAME: the sharded folder being replaced
      .checkpoint.<epoch>.tmp/ staging_name(epoch): a sharded folder being written
                               (all of them: STAGING_PATTERN)
      .checkpoint.lock         REPAIR_LOCK_NAME: the lock of a sharded folder's repair
      checkpoints/             KEPT_NAME: the older checkpoints kept (--keep K > 1),
        epoch-0002-step-0000013.pt  position_label(2, 13) + KEPT_SUFFIX (or a sharded folder;
                                    POSITION_PREFIX begins every one)
      tensorboard/             TENSORBOARD_NAME: TensorBoard's event files (--tensorboard)
      embeddings/              EMBEDDINGS_NAME: the evaluation embeddings kept for plot, evaluate
      evaluation.json          EVALUATION_NAME: marginface evaluate's metrics
      evaluation.html          EVALUATION_REPORT_NAME: its page (with --quality),
      erc.png                  ERC_NAME: and its error-versus-reject picture
      outliers.csv             OUTLIERS_NAME: marginface outliers' list
      plots/                   PLOTS_NAME: marginface plot's pictures and report.html
      ijb/                     IJB_NAME: marginface ijb's results, <prefix>roc.png, ...
      model.ts                 TORCHSCRIPT_NAME: marginface export's backbone (TorchScript),
      model.onnx               ONNX_NAME: (ONNX),
      backbone.safetensors     SAFETENSORS_NAME: (safetensors)

``report.html`` (:data:`REPORT_NAME`) is also the page of ``compare`` and ``demo`` in their
output folders. Temporary files of atomic writes end in ``.tmp`` (:mod:`marginface._atomic`).
"""

from __future__ import annotations

__all__ = [
    "CHECKPOINT_NAME",
    "CONFIG_NAME",
    "EMBEDDINGS_NAME",
    "ERC_NAME",
    "EVALUATION_NAME",
    "EVALUATION_REPORT_NAME",
    "HISTORY_NAME",
    "IJB_NAME",
    "INDEX_NAME",
    "KEPT_NAME",
    "KEPT_SUFFIX",
    "ONNX_NAME",
    "OUTLIERS_NAME",
    "PLOTS_NAME",
    "POSITION_PREFIX",
    "REPAIR_LOCK_NAME",
    "REPLACED_SHARDED_NAME",
    "REPORT_NAME",
    "SAFETENSORS_NAME",
    "SHARDED_CHECKPOINT_NAME",
    "SIDECAR_NAME",
    "STAGING_PATTERN",
    "TENSORBOARD_NAME",
    "TORCHSCRIPT_NAME",
    "VERIFICATION_NAME",
    "position_label",
    "staging_name",
]

CONFIG_NAME = "config.toml"
HISTORY_NAME = "history.csv"
VERIFICATION_NAME = "verification.csv"
CHECKPOINT_NAME = "checkpoint.pt"
SHARDED_CHECKPOINT_NAME = "checkpoint"
SIDECAR_NAME = "marginface.json"
INDEX_NAME = ".metadata"
"""DCP's index of the tensors (their keys, global shapes, dtypes and where each shard lies)."""
REPLACED_SHARDED_NAME = ".checkpoint.old"
REPAIR_LOCK_NAME = ".checkpoint.lock"
STAGING_PATTERN = ".checkpoint.*.tmp"
"""The glob of :func:`staging_name`'s folders (stale ones are removed before a write)."""
KEPT_NAME = "checkpoints"
KEPT_SUFFIX = ".pt"
"""The suffix of a kept one-process checkpoint (a kept sharded one is a folder, no suffix)."""
POSITION_PREFIX = "epoch-"
TENSORBOARD_NAME = "tensorboard"
EMBEDDINGS_NAME = "embeddings"
EVALUATION_NAME = "evaluation.json"
EVALUATION_REPORT_NAME = "evaluation.html"
ERC_NAME = "erc.png"
IJB_NAME = "ijb"
OUTLIERS_NAME = "outliers.csv"
PLOTS_NAME = "plots"
REPORT_NAME = "report.html"
TORCHSCRIPT_NAME = "model.ts"
ONNX_NAME = "model.onnx"
SAFETENSORS_NAME = "backbone.safetensors"


def position_label(epoch: int, step: int) -> str:
    """``epoch-EEEE-step-SSSSSSS``: ``epoch`` complete epochs and ``step`` steps of the next
    one (zero-padded, so names sort in training order)."""
    return f"{POSITION_PREFIX}{epoch:04d}-step-{step:07d}"


def staging_name(epoch: int) -> str:
    """``.checkpoint.<epoch>.tmp``: the folder a sharded checkpoint of ``epoch`` is written
    into before it is swapped in as :data:`SHARDED_CHECKPOINT_NAME`."""
    return f".checkpoint.{epoch}.tmp"
