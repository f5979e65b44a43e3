"""The one gradient path of every task's training step.

    scaled = scale_loss(optimizer, loss_share)        # float16 loss scaling
    grads = unscale_gradients(optimizer, tape.gradient(scaled, variables))
    [grads = add_l2_gradients(grads, variables, l2_regularized_kernels(...))]
    apply_gradients(optimizer, grads, variables, clip_norm[, per_variable])

`loss_share` is this replica's share of the global-batch loss (its sum over
replicas is the loss). `apply_gradients` makes sparse gradients dense, sums
them over replicas, clips the *summed* gradient by its global norm (or,
with `per_variable`, each variable's gradient by its own norm, as the
YouTube-8M starter code's `utils.clip_gradient_norms` does) and applies it
(`minimize` does the four lines for a tape). The L2 helpers compute the
value of plain-L2 kernel regularization outside XLA and add its gradient
directly (YT8M's fast path).
"""
import inspect
from typing import List, Optional, Sequence, Tuple

import tensorflow as tf, tf_keras


def _is_loss_scaled(optimizer) -> bool:
  return isinstance(optimizer, tf_keras.mixed_precision.LossScaleOptimizer)


def scale_loss(optimizer, loss: tf.Tensor) -> tf.Tensor:
  """The loss scaled for a LossScaleOptimizer (float16), else as is."""
  return optimizer.get_scaled_loss(loss) if _is_loss_scaled(optimizer) else loss


def unscale_gradients(optimizer, grads: Sequence[Optional[tf.Tensor]]
                      ) -> List[Optional[tf.Tensor]]:
  """Gradients of a `scale_loss`-scaled loss, back to the loss's scale."""
  if _is_loss_scaled(optimizer):
    return list(optimizer.get_unscaled_gradients(list(grads)))
  return list(grads)


def apply_gradients(optimizer, grads: Sequence[Optional[tf.Tensor]],
                    variables: Sequence[tf.Variable],
                    clip_norm: float, per_variable: bool = False) -> None:
  """Applies this replica's unscaled gradients, clipped after the sum.

  Sparse gradients (`tf.IndexedSlices`, e.g. of an embedding) are made dense
  first: their row counts differ between replicas, which a cross-replica
  all-reduce of slices cannot sum. With `clip_norm` > 0 the gradient summed
  over replicas is clipped by its global norm, or each variable's by its
  own norm with `per_variable` (`clip_and_apply_gradients`); otherwise the
  optimizer sums and applies.

  Args:
    optimizer: a tf_keras optimizer (a LossScaleOptimizer receives unscaled
      gradients and applies them as they are).
    grads: one per variable (None allowed), from `unscale_gradients`.
    variables: the trainable variables.
    clip_norm: maximum global norm of the summed gradient; <= 0: no clipping.
    per_variable: clip each variable's summed gradient to norm `clip_norm`
      (`tf.clip_by_norm`) instead of the global norm.
  """
  grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
           for g in grads]
  if clip_norm > 0:
    clip_and_apply_gradients(optimizer, grads, variables, clip_norm,
                             per_variable=per_variable)
  else:
    optimizer.apply_gradients(list(zip(grads, variables)))


def minimize(optimizer, tape: tf.GradientTape, scaled_loss: tf.Tensor,
             variables: Sequence[tf.Variable], clip_norm: float,
             per_variable: bool = False) -> None:
  """`apply_gradients` of the unscaled gradients of `scaled_loss`.

  Args:
    optimizer: the task's optimizer.
    tape: the tape that recorded `scaled_loss`.
    scaled_loss: `scale_loss(optimizer, this replica's loss share)`.
    variables: the trainable variables.
    clip_norm: see `apply_gradients`.
    per_variable: see `apply_gradients`.
  """
  grads = unscale_gradients(optimizer, tape.gradient(scaled_loss, variables))
  apply_gradients(optimizer, grads, variables, clip_norm, per_variable)


def _skip_aggregation_kwargs(optimizer) -> dict:
  """kwargs of `optimizer.apply_gradients` that skip the cross-replica sum."""
  params = inspect.signature(optimizer.apply_gradients).parameters
  if 'experimental_aggregate_gradients' in params:  # legacy optimizers
    return {'experimental_aggregate_gradients': False}
  if 'skip_gradients_aggregation' in params:  # tf_keras.optimizers.Optimizer
    return {'skip_gradients_aggregation': True}
  return {}


def clip_and_apply_gradients(optimizer, grads: Sequence[tf.Tensor],
                             variables: Sequence[tf.Variable],
                             clip_norm: float,
                             per_variable: bool = False) -> None:
  """Clips the GLOBAL gradient by its global norm (or each variable's
  gradient by its own norm), then applies it.

  Called in a replica context with this replica's (already unscaled)
  gradients. With several replicas the gradients are first summed across
  replicas and the sum is clipped, so an N-replica step updates the weights
  exactly like a 1-replica step on the same global batch. (Clipping each
  replica's partial gradient before the sum, as Model Garden's YT8M task
  does, clips a different vector whenever replicas > 1.)

  Args:
    optimizer: a tf_keras optimizer (legacy or not; a LossScaleOptimizer
      receives unscaled gradients).
    grads: this replica's gradients, one per variable (None allowed).
    variables: the trainable variables.
    clip_norm: maximum global norm of the summed gradient.
    per_variable: clip each variable's summed gradient to norm `clip_norm`
      (`clip_by_norm_per_variable`) instead.
  """
  grads = list(grads)
  replica_context = tf.distribute.get_replica_context()
  num_replicas = tf.distribute.get_strategy().num_replicas_in_sync
  kwargs = {}
  if replica_context is not None and num_replicas > 1:
    kwargs = _skip_aggregation_kwargs(optimizer)
    if kwargs:
      # Sparse gradients (e.g. of an embedding) can have different row
      # counts on different replicas, which an all-reduce cannot sum.
      grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices)
               else g for g in grads]
      present = [i for i, g in enumerate(grads) if g is not None]
      summed = replica_context.all_reduce(
          tf.distribute.ReduceOp.SUM, [grads[i] for i in present])
      for i, g in zip(present, summed):
        grads[i] = g
    # An optimizer that cannot skip aggregation gets per-replica clipping.
  if per_variable:
    grads = clip_by_norm_per_variable(grads, clip_norm)
  else:
    grads = clip_by_global_norm(grads, clip_norm)
  optimizer.apply_gradients(list(zip(grads, variables)), **kwargs)


def clip_by_global_norm(grads: Sequence[tf.Tensor], clip_norm: float):
  """`tf.clip_by_global_norm`, without a rescaling pass when nothing clips.

  Same result as `tf.clip_by_global_norm(grads, clip_norm)[0]` (None entries
  kept, a non-finite norm gives NaN gradients as TensorFlow does), but the
  gradients are only rescaled (one more read and write of every gradient:
  ~0.8 GB for the published YT8M model) when their norm exceeds `clip_norm`.
  """
  grads = list(grads)
  present = [i for i, g in enumerate(grads) if g is not None]
  if not present:
    return grads
  values = [grads[i] for i in present]
  norm = tf.linalg.global_norm(values)
  needs_scaling = tf.logical_not(norm <= clip_norm)  # True for NaN too.

  def scaled():
    return tf.clip_by_global_norm(values, clip_norm, use_norm=norm)[0]

  def unchanged():
    return [tf.identity(v) for v in values]

  clipped = tf.cond(needs_scaling, scaled, unchanged)
  for i, g in zip(present, clipped):
    grads[i] = g
  return grads


def clip_by_norm_per_variable(grads: Sequence[Optional[tf.Tensor]],
                              clip_norm: float) -> List[Optional[tf.Tensor]]:
  """Each gradient clipped to L2 norm `clip_norm` on its own
  (`tf.clip_by_norm`; None entries kept): the starter code's and the
  NeXtVLAD authors' `utils.clip_gradient_norms`."""
  return [None if g is None else tf.clip_by_norm(g, clip_norm) for g in grads]


def l2_regularized_kernels(model: tf_keras.Model
                           ) -> Optional[List[Tuple[tf.Variable, float]]]:
  """(variable, l2) of every kernel whose regularizer is `regularizers.L2`.

  Returns None unless these account for every loss in `model.losses` (other
  regularizers or activity losses present): then callers keep the generic
  `model.losses` path.
  """
  pairs = []
  for layer in model._flatten_layers(include_self=False):  # pylint: disable=protected-access
    reg = getattr(layer, 'kernel_regularizer', None)
    kernel = getattr(layer, 'kernel', None)
    if reg is None or kernel is None:
      continue
    if type(reg) is not tf_keras.regularizers.L2:  # pylint: disable=unidiomatic-typecheck
      return None
    pairs.append((kernel, float(reg.l2)))
  if len(pairs) != len(model.losses):
    return None
  return pairs


def l2_loss(pairs: Sequence[Tuple[tf.Variable, float]]) -> tf.Tensor:
  """sum_i l2_i * sum(w_i ** 2): `model.losses` of `l2_regularized_kernels`.

  Computed with `tf.nn.l2_loss` (a multi-threaded kernel): on a 2-core CPU it
  reads the 85 M-weight YT8M MoE kernel in 0.02 s, where the same sum inside
  an XLA program (one thread) or as reduce_sum(square(w)) takes 0.2-0.3 s.
  Run it outside XLA.
  """
  return tf.add_n([2.0 * l2 * tf.nn.l2_loss(tf.cast(v, tf.float32))
                   for v, l2 in pairs])


def add_l2_gradients(grads: Sequence[Optional[tf.Tensor]],
                     variables: Sequence[tf.Variable],
                     pairs: Sequence[Tuple[tf.Variable, float]],
                     scale: float = 1.0) -> List[Optional[tf.Tensor]]:
  """grads + scale * 2 * l2 * w for the regularized kernels in `pairs`."""
  coefficient = {id(v): 2.0 * l2 * scale for v, l2 in pairs}
  out = []
  for g, v in zip(grads, variables):
    c = coefficient.get(id(v))
    if c is not None:
      term = tf.cast(c, v.dtype) * v
      g = term if g is None else g + tf.cast(term, g.dtype)
    out.append(g)
  return out
