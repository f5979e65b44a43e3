"""The one gradient path of every task's training step."""
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
  """Gradients of a `scale_loss`-scaled loss, at the loss's scale."""
  if _is_loss_scaled(optimizer):
    return list(optimizer.get_unscaled_gradients(list(grads)))
  return list(grads)


def apply_gradients(optimizer, grads: Sequence[Optional[tf.Tensor]],
                    variables: Sequence[tf.Variable],
                    clip_norm: float, per_variable: bool = False) -> None:
  """Applies this replica's unscaled gradients, clipped after the replica sum.

  Args:
    optimizer: a tf_keras optimizer.
    grads: one per variable (None allowed), from `unscale_gradients`.
    variables: the trainable variables.
    clip_norm: maximum global norm of the summed gradient; <= 0: none.
    per_variable: clip each variable's summed gradient to `clip_norm`.
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
  """`apply_gradients` of `scaled_loss`'s unscaled gradients on `tape`."""
  grads = unscale_gradients(optimizer, tape.gradient(scaled_loss, variables))
  apply_gradients(optimizer, grads, variables, clip_norm, per_variable)


def _skip_aggregation_kwargs(optimizer) -> dict:
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
  """Clips the replica sum of the gradients, then applies it."""
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
  """`tf.clip_by_global_norm(...)[0]`, rescaling only when it clips."""
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
  """Each gradient clipped to norm `clip_norm` on its own."""
  return [None if g is None else tf.clip_by_norm(g, clip_norm) for g in grads]


def l2_regularized_kernels(model: tf_keras.Model
                           ) -> Optional[List[Tuple[tf.Variable, float]]]:
  """(variable, l2) of the `regularizers.L2` kernels, or None.

  None unless they account for every loss in `model.losses`.
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
  """sum_i l2_i * sum(w_i ** 2) (`tf.nn.l2_loss`); outside XLA."""
  return tf.add_n([2.0 * l2 * tf.nn.l2_loss(tf.cast(v, tf.float32))
                   for v, l2 in pairs])


def add_l2_gradients(grads: Sequence[Optional[tf.Tensor]],
                     variables: Sequence[tf.Variable],
                     pairs: Sequence[Tuple[tf.Variable, float]],
                     scale: float = 1.0) -> List[Optional[tf.Tensor]]:
  """grads + scale * 2 * l2 * w for the kernels in `pairs`."""
  coefficient = {id(v): 2.0 * l2 * scale for v, l2 in pairs}
  out = []
  for g, v in zip(grads, variables):
    c = coefficient.get(id(v))
    if c is not None:
      term = tf.cast(c, v.dtype) * v
      g = term if g is None else g + tf.cast(term, g.dtype)
    out.append(g)
  return out
