"""The head: :class:`MarginSoftmaxLoss`, the ``nn.Module`` that owns the class centers and wires
one margin to one executor. Its parts live beside it, one concept a file: the class centers
(``centers.py``), Partial FC sampling (``sampling.py``), the executor choice and its memory
figures (``executor_choice.py``), the sub-center clean-up (``subcenter_cleanup.py``), the input
checks of the plain and sharded paths (``inputs.py``), the checkpoint layout (``state.py``)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn

from .._validation import (
    check_choice,
    check_device,
    check_dtype,
    check_embeddings,
    check_int,
    check_labels,
    check_real,
    check_representable,
)
from ..class_parameters import (
    class_regularizer,
    create_class_parameters,
    reset_class_parameters,
    target_class_values,
)
from ..executors.choice import DEFAULT_MEMORY_BUDGET, IMPLEMENTATIONS, row_block_bytes
from ..executors.chunk_plan import KERNELS, check_chunkable
from ..executors.chunked import chunked_margin_cross_entropy, sharded_margin_cross_entropy
from ..executors.dense import dense_margin_cross_entropy, row_norms
from ..executors.margin_loss import REDUCTIONS, reduce_loss
from ..executors.sharding import ClassShard, scale_gradient
from ..margins.base import Margin
from ..subcenters import PAPER_OUTLIER_DEGREES, Outliers, sub_center_counts
from ..weight_regularizers import WeightRegularizer, check_weight_regularizer, regularize_weight
from .centers import center_cosine, create_shard, new_centers, reset_centers
from .executor_choice import head_dense_step_bytes, head_executor, head_row_block_rows
from .inputs import step_labels
from .sampling import classes_of_step, sampled_centers
from .state import full_weight_to_shard, weight_as_dtensor
from .subcenter_cleanup import dominant_only, outliers_of_all, own_samples

__all__ = ["MarginSoftmaxLoss"]


class MarginSoftmaxLoss(nn.Module):
    r"""Margin-based softmax cross-entropy with learnable class centers.

    .. math::
        L = \frac1N\sum_i -\log\frac{e^{\text{logit}_{i,y_i}}}{\sum_j e^{\text{logit}_{ij}}},\qquad
        \text{logit} = \text{margin}\Big(\frac{x_i^\top w_j}{\|x_i\|\|w_j\|},\ y_i\Big)

    Args:
        num_classes: ``C >= 2``.
        embedding_dim: ``D >= 1``.
        margin: the :class:`~marginface.margins.Margin` that turns cosines into logits.
        sub_centers: ``K >= 1`` centers per class, cosine max-pooled over them. Default: 1.
        reduction: ``"mean"`` (default), ``"sum"`` or ``"none"`` (``Tensor[N]``).
        impl: the executor. ``"dense"`` (default) materializes the ``N×C`` logits;
            ``"chunked"`` never does (:mod:`marginface.executors.chunked`; raises
            ``ValueError`` for a margin that cannot run chunked); ``"row_block"`` is the same
            chunk loop tiled over rows as well: each block of :meth:`row_block_rows` rows runs
            forward and backward in one pass (3 GEMMs instead of 4, a ``rows × C·K`` store of
            products; ``chunked_margin_cross_entropy``'s ``row_block``); ``"auto"`` picks per
            batch (:meth:`executor`): dense while its logits fit ``memory_budget``, else one
            row block of all rows where that was measured the faster and fits
            ``memory_budget``, else chunked (dense if the margin cannot run chunked).
        memory_budget: bytes that ``impl="auto"`` lets a dense step's ``N×C`` matrices, or the
            row blocks' store of products, take, an integer ``>= 0``. Default:
            :data:`DEFAULT_MEMORY_BUDGET` (256 MiB: dense up to ``N·C = 16M`` in float32).
            Raise it to run dense on larger batches (in float32 the fastest under
            ``torch.compile``, if it fits); 0 runs chunked always.
            Not consulted by ``"dense"``/``"chunked"``/``"row_block"``.
        row_block: rows per block of the row-block tiling, ``>= 1``. Default: None, the
            fewest even blocks whose store fits :data:`DEFAULT_ROW_BLOCK_BYTES`
            (``impl="row_block"``), one block (``impl="auto"``). Not consulted by
            ``"dense"``/``"chunked"``.
        chunk_size: classes per chunk of the chunked executor, ``>= 1``. Default: None, chosen
            per batch so that a chunk's workspace is 16 MiB (8192 classes at N = 512 in fp32,
            5461 with a bf16 weight; a Partial FC step also gathers the chunk's sampled rows:
            2730 and 3276 at D = 512; :func:`~marginface.executors.chunked.default_chunk_size`).
        kernels: who runs the chunked executor's per-chunk work: ``"auto"`` (Triton for CUDA
            tensors when triton imports and the margin's non-target rule is compiled in, else
            PyTorch), ``"torch"`` or ``"triton"`` (``ValueError`` at the step where the kernels
            cannot run); see :data:`~marginface.executors.chunk_plan.KERNELS`. Default: None,
            the environment variable ``MARGINFACE_KERNELS`` read at each step's entry (unset:
            ``"auto"``). Not consulted by the dense executor.
        device, dtype: where and how the class centers are created. With ``torch.float64``
            the margin's floating buffers (CurricularFace's ``t``, AdaFace's statistics...) are
            made float64 too; otherwise they stay float32.
        process_group: shard the classes over this ``torch.distributed`` group (e.g.
            ``torch.distributed.group.WORLD``); None (default): one process holds every class.
            Rank ``r`` owns the contiguous block :attr:`class_range` (blocks of ``⌈C/W⌉``) and
            :attr:`weight` holds only that block; ``num_classes`` stays the global count. Each
            step gathers the embeddings and labels of every rank (local batch sizes may differ)
            and returns the loss of the *global* batch, identical on every rank; the chunked
            executor runs inside each shard (``impl`` is not consulted). The backbone's gradient
            is scaled by ``W`` so that DistributedDataParallel's averaging yields the gradient
            of the global-batch loss (:func:`~marginface.executors.sharding.scale_gradient`).
            Do not wrap the loss itself in DDP: its weight is sharded, not replicated.
        sample_rate: Partial FC, in ``(0, 1]``. Default: 1.0 (every class). Below 1, each
            training step keeps every class that is a positive anywhere in the (global) batch
            plus uniformly drawn negatives, ``⌊sample_rate·c⌋`` classes in all from each
            rank's ``c`` classes (insightface's rule); the softmax runs over the sampled classes
            only and unsampled centers get a gradient of exactly zero. The chunked executor
            reads the sampled centers in place, one chunk at a time (no copy of them or of
            their gradient; the dense one copies them). In eval mode every class
            is used. Optimizers still update unsampled rows from their state: SGD's momentum
            and weight decay and Adam's moments keep moving them (docs/distributed.md).
        weight_regularizer: a term on the centers of the batch's classes added to every
            sample's loss (:mod:`marginface.weight_regularizers`, e.g. SphereFace+'s
            ``MinimumHypersphericalEnergy()``); exact on a class-sharded head. Default: None.

    Attributes:
        weight: ``Parameter[C·K, D]`` (sharded: ``Parameter[(stop - start)·K, D]``), the class
            centers (class-major for sub-centers), initialized ``N(0, 0.01²)`` (insightface);
            only their direction matters.
        class_parameters: ``ParameterDict``, one ``Parameter[C]`` (sharded: ``[stop - start]``)
            per learnable per-class value the margin declares (AdaM-Softmax's ``"margin"``;
            empty for the other margins), made, gathered and regularized by
            :mod:`marginface.class_parameters`.
        margin: the margin module (its buffers are part of this module's ``state_dict``;
            replicated and updated identically on every rank when sharded).
        class_range: ``(start, stop)``, the classes held in :attr:`weight`.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_dim: int,
        margin: Margin,
        *,
        sub_centers: int = 1,
        reduction: str = "mean",
        impl: str = "dense",
        chunk_size: int | None = None,
        kernels: str | None = None,
        memory_budget: int = DEFAULT_MEMORY_BUDGET,
        row_block: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        process_group: dist.ProcessGroup | None = None,
        sample_rate: float = 1.0,
        weight_regularizer: WeightRegularizer | None = None,
    ) -> None:
        super().__init__()
        self.num_classes = check_int("num_classes", num_classes, minimum=2)
        self.embedding_dim = check_int("embedding_dim", embedding_dim, minimum=1)
        self.sub_centers = check_int("sub_centers", sub_centers, minimum=1)
        self.reduction = check_choice("reduction", reduction, REDUCTIONS)
        self.impl = check_choice("impl", impl, IMPLEMENTATIONS)
        if not isinstance(margin, Margin):
            raise TypeError(f"margin must be a marginface Margin, got {type(margin).__name__}")
        dtype = check_dtype("dtype", dtype)
        device = check_device("device", device)
        compute = torch.float64 if dtype == torch.float64 else torch.float32
        for name, value in vars(margin).items():
            if isinstance(value, float):
                check_representable(name, value, compute)
        if impl in ("chunked", "row_block"):
            check_chunkable(margin)
        self.chunk_size = (
            None if chunk_size is None else check_int("chunk_size", chunk_size, minimum=1)
        )
        self.kernels = None if kernels is None else check_choice("kernels", kernels, KERNELS)
        self.memory_budget = check_int("memory_budget", memory_budget, minimum=0)
        self.row_block = None if row_block is None else check_int("row_block", row_block, minimum=1)
        self.sample_rate = check_real("sample_rate", sample_rate, positive=True, at_most=1.0)
        self.weight_regularizer = check_weight_regularizer(weight_regularizer)
        if dtype == torch.float64:  # the running statistics keep float64 precision too
            margin.to(dtype=torch.float64)
        self.margin = margin
        self.shard: ClassShard | None = None
        start, stop = 0, self.num_classes
        if process_group is not None:
            signature = (self.num_classes, self.embedding_dim, self.sub_centers, self.sample_rate)
            signature += (str(dtype),)
            signature += (type(margin).__name__, margin.extra_repr())
            self.shard = create_shard(process_group, self.num_classes, signature)
            start, stop = self.shard.start, self.shard.stop
        self.class_range = (start, stop)
        self.weight = new_centers(
            stop - start, sub_centers, embedding_dim, device=device, dtype=dtype
        )
        self.class_parameters = create_class_parameters(
            margin, stop - start, device=device, dtype=dtype
        )
        self.reset_parameters()
        self._register_load_state_dict_pre_hook(full_weight_to_shard, with_module=True)
        if self.shard is not None:
            self._register_state_dict_hook(weight_as_dtensor)

    def reset_parameters(self) -> None:
        """Re-draw the class centers from ``N(0, 0.01²)`` and the per-class parameters from
        their declared ``U(init_low, init_high)``."""
        reset_centers(self.weight)
        reset_class_parameters(self.class_parameters, self.margin)

    def cosine(self, embeddings: Tensor) -> Tensor:
        """Cosines to every class center, ``Tensor[N, D] -> Tensor[N, C]`` (sub-centers pooled).

        Computed in float32 (float64 for float64 inputs) with autocast disabled.
        """
        check_embeddings(embeddings, self.embedding_dim)
        return center_cosine(embeddings, self.weight, self.sub_centers)

    def logits(self, embeddings: Tensor, labels: Tensor | None = None) -> Tensor:
        """Scaled logits ``Tensor[N, C]``.

        With ``labels``: margin-adjusted, as the loss sees them (in training mode this advances
        stateful margins, like :meth:`forward`). Without: plain ``s·cos θ`` for inference
        (the usual evaluation-time logits), with the margin's current scale.
        """
        cosine = self.cosine(embeddings)
        norms = row_norms(embeddings.to(cosine.dtype))
        if labels is None:
            return cosine * self.margin.scale_for(norms)
        labels = check_labels(labels, embeddings.shape[0], self.num_classes)
        norms = norms if self.margin.requires_norms else None
        local = labels - self.class_range[0]
        class_values = target_class_values(self.class_parameters, self.margin, local, None)
        return self.margin.apply(cosine, labels, norms, class_values)

    def forward(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        """The loss.

        Args:
            embeddings: ``Tensor[N, D]`` (any floating dtype; the math runs in fp32 or fp64).
                Sharded: this rank's rows; ``N`` may differ between ranks and steps.
            labels: ``Tensor[N]`` of class indices in ``[0, C)``, any integer dtype.

        Returns:
            A 0-dim tensor (``"mean"``, ``"sum"``) or ``Tensor[N]`` (``"none"``); sharded, the
            loss of the global batch (``"none"``: ``Tensor[N_global]``, rows in rank order).
        """
        step = step_labels(embeddings, labels, self.embedding_dim, self.num_classes, self.shard)
        targets, sampled = self._classes_of_step(step)  # step: sharded, the global batch's
        class_values = target_class_values(self.class_parameters, self.margin, targets, sampled)
        if self.shard is not None:
            per_sample = sharded_margin_cross_entropy(
                scale_gradient(embeddings, self.shard.world_size),
                self.weight,
                targets,
                step,
                self.margin,
                self.shard,
                sub_centers=self.sub_centers,
                chunk_size=self.chunk_size,
                kernels=self.kernels,
                sampled_classes=sampled,  # read in place, chunk by chunk
                class_values=class_values,  # this rank's classes' values, 0 elsewhere
            )
        else:
            per_sample = self._local_cross_entropy(embeddings, targets, sampled, class_values)
        extra = class_regularizer(self.class_parameters, self.margin, self.num_classes, self.shard)
        if self.weight_regularizer is not None:
            term = regularize_weight(self.weight_regularizer, self.weight, labels, self)  # own rows
            extra = term if extra is None else extra + term
        if extra is not None:
            per_sample = per_sample + extra.to(per_sample.dtype)
        return reduce_loss(per_sample, self.reduction)

    def _local_cross_entropy(
        self,
        embeddings: Tensor,
        targets: Tensor,
        sampled: Tensor | None,
        class_values: dict[str, Tensor] | None,
    ) -> Tensor:
        """Per-sample losses ``Tensor[N]`` of one process's batch on the executor
        :meth:`executor` picks (chunked and row-block read Partial FC's sample in place)."""
        executor = self.executor(embeddings.shape[0])
        if executor in ("chunked", "row_block"):
            rows = embeddings.shape[0]
            return chunked_margin_cross_entropy(
                embeddings,
                self.weight,
                targets,
                self.margin,
                sub_centers=self.sub_centers,
                chunk_size=self.chunk_size,
                kernels=self.kernels,
                sampled_classes=sampled,  # read in place, chunk by chunk
                class_values=class_values,
                row_block=self.row_block_rows(rows) if executor == "row_block" else None,
            )
        return dense_margin_cross_entropy(
            embeddings,
            sampled_centers(self.weight, sampled, self.sub_centers),  # dense: an S·K×D copy
            targets,
            self.margin,
            sub_centers=self.sub_centers,
            class_values=class_values,
        )

    def _classes_of_step(self, labels: Tensor) -> tuple[Tensor, Tensor | None]:
        """Each row's target among this step's classes and Partial FC's sample
        (:func:`~marginface.head.sampling.classes_of_step`; every class in eval mode)."""
        rate = self.sample_rate if self.training else 1.0
        if self.shard is None and rate >= 1.0:  # checked labels in [0, C): their own targets
            return labels, None
        return classes_of_step(labels, self.class_range, rate, self.weight.device)

    # ------------------------------------------------------------ sub-center clean-up
    def _own_samples(self, embeddings: Tensor, labels: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The samples of the classes in :attr:`class_range`: ``(positions, x, local labels)``."""
        return own_samples(
            embeddings,
            labels,
            embedding_dim=self.embedding_dim,
            class_range=self.class_range,
            num_classes=self.num_classes,
        )

    def dominant_sub_centers(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        """Each class's dominant sub-center (the one with the most samples nearest to it;
        :func:`~marginface.subcenters.dominant_sub_centers`), ``int64[c]`` for the classes of
        :attr:`class_range` (all ``C`` unless sharded; a sharded head judges its own classes
        from the samples given, so pass the same samples, e.g. the training set, on every rank).

        Args:
            embeddings: ``Tensor[N, D]``, typically the training set's.
            labels: ``Tensor[N]`` in ``[0, C)``.
        """
        _, x, local = self._own_samples(embeddings, labels)
        counts = sub_center_counts(x, local, self.weight, self.sub_centers)
        return counts.argmax(dim=1)

    def find_outliers(
        self,
        embeddings: Tensor,
        labels: Tensor,
        *,
        threshold_degrees: float = PAPER_OUTLIER_DEGREES,
    ) -> Outliers:
        """The samples farther than ``threshold_degrees`` (default 75°, the Sub-center ArcFace
        paper's) from their class's dominant sub-center
        (:func:`~marginface.subcenters.find_outliers`). ``indices`` and ``angles`` refer to the
        samples given; a sharded head judges only its own classes (the other samples' angles
        are NaN), and ``dominant``/``counts`` cover :attr:`class_range`."""
        positions, x, local = self._own_samples(embeddings, labels)
        return outliers_of_all(
            positions,
            x,
            local,
            self.weight,
            self.sub_centers,
            total=embeddings.shape[0],
            threshold_degrees=threshold_degrees,
        )

    def drop_non_dominant_centers(self, dominant: Tensor) -> None:
        """Keep only each class's dominant sub-center: the head becomes ``K = 1`` in place.

        :attr:`weight` is replaced by a new ``Parameter[c, D]`` (same dtype, device and
        ``requires_grad``), so build the optimizer after this call. A sharded head keeps the
        dominant centers of its own block.

        Args:
            dominant: ``int64`` in ``[0, K)``, one entry per class: ``[C]`` (all classes; a
                sharded head takes its :attr:`class_range`) or ``[c]`` (this head's classes),
                e.g. :meth:`dominant_sub_centers`.

        Raises:
            ValueError: the head has one center per class already, or ``dominant`` has the
                wrong shape or values.
        """
        kept = dominant_only(
            self.weight,
            dominant,
            self.sub_centers,
            class_range=self.class_range,
            num_classes=self.num_classes,
            sharded=self.shard is not None,
        )
        self.weight = nn.Parameter(kept, requires_grad=self.weight.requires_grad)
        self.sub_centers = 1

    # ------------------------------------------------------------ executor, memory figures
    def executor(self, batch_size: int) -> str:
        """The executor a batch of ``batch_size`` rows runs on: ``"dense"``, ``"chunked"`` or
        ``"row_block"`` (``impl="auto"``:
        :func:`~marginface.executors.choice.choose_executor`'s rule)."""
        return head_executor(
            self.impl,
            batch_size,
            classes=self.num_classes * self.sub_centers,
            embedding_dim=self.embedding_dim,
            weight=self.weight,
            reduction=self.reduction,
            memory_budget=self.memory_budget,
            margin=self.margin,
        )

    def row_block_rows(self, batch_size: int) -> int:
        """Rows per block of the row-block executor for a batch of ``batch_size`` rows: the
        ``row_block`` given; else, for ``impl="auto"``, all rows in one block (its rule), and
        for ``impl="row_block"`` :func:`~marginface.executors.choice.default_row_block` (the
        fewest even blocks whose store fits :data:`DEFAULT_ROW_BLOCK_BYTES`)."""
        classes = self.num_classes * self.sub_centers
        return head_row_block_rows(
            self.impl, self.row_block, batch_size, classes, self.weight.dtype
        )

    def row_block_bytes(self, rows: int) -> int:
        """Bytes of the row-block executor's store of products for a block of ``rows`` rows
        (:func:`~marginface.executors.choice.row_block_bytes`), e.g. 205 MB for 512 rows at
        C = 100k in float32."""
        return row_block_bytes(rows, self.num_classes * self.sub_centers, self.weight.dtype)

    def dense_step_bytes(self, batch_size: int) -> int:
        """Estimated bytes a dense training step holds beyond the inputs, the weight and the
        gradients (:func:`~marginface.executors.choice.dense_step_bytes`), e.g. 819 MB at
        N = 512, C = 100k, float32."""
        classes = self.num_classes * self.sub_centers
        return head_dense_step_bytes(batch_size, classes, self.weight.dtype, self.margin)

    def extra_repr(self) -> str:
        extra = f", sub_centers={self.sub_centers}" if self.sub_centers > 1 else ""
        return (
            f"num_classes={self.num_classes}, embedding_dim={self.embedding_dim}{extra}, "
            f"reduction={self.reduction!r}, impl={self.impl!r}"
            + (f", chunk_size={self.chunk_size}" if self.impl != "dense" else "")
            + (f", kernels={self.kernels!r}" if self.kernels is not None else "")
            + (f", memory_budget={self.memory_budget}" if self.impl == "auto" else "")
            + (f", row_block={self.row_block}" if self.row_block is not None else "")
        )
