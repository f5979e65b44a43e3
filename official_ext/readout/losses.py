"""Readout losses by type, weighted by per-query weights.

Per query i of a task (predictions p_i = the head's output, targets y_i),
the loss of its readout type (`readout_types`); the shipped types' losses
(`builtin_types`, `von_mises`):

* continuous: mean squared error over the `dim` channels,
  mean_c (p_ic - y_ic)^2.
* binary, multilabel: sigmoid cross-entropy of the logits p_i against labels
  y_i in [0, 1], averaged over the channels.
* multinomial: softmax cross-entropy of the logits p_i ([dim]) against the
  class id y_i (stored as one float, an integer in [0, dim)).
* event_rate: Poisson negative log-likelihood with log-rate input,
  mean_c (exp(p_ic) - y_ic * p_ic) (the constant log(y!) is left out, as in
  `torch.nn.PoissonNLLLoss(log_input=True, full=False)`).
* von_mises: the von Mises negative log-likelihood of an angle, the head
  giving the mean direction and concentration (`von_mises`).

Task loss = sum_i w_i l_i / sum_i w_i over the task's queries (0 when the task
has no query of positive weight); a query of weight 0 contributes nothing to
the loss or its gradient, even if its prediction or target is not finite.
Total loss = sum over tasks of `loss_weight * task loss`.

Under a distribution strategy every replica holds part of each task's queries.
`loss_sums` returns the numerator and denominator per task so the caller can
sum the denominators over replicas (`global_task_losses`): the replicas'
losses then add up to the loss of the global batch exactly.
"""
from typing import Dict, Mapping, Optional, Tuple

import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official_ext.readout import configs
from official_ext.readout import readout_types

Sums = Dict[str, Tuple[tf.Tensor, tf.Tensor]]


def per_query_loss(spec: configs.ReadoutSpec, predictions: tf.Tensor,
                   targets: tf.Tensor) -> tf.Tensor:
  """Unweighted loss of each query: the loss of the spec's readout type
  (`readout_types`).

  Args:
    spec: the task's ReadoutSpec.
    predictions: float [n, dim] head outputs.
    targets: float [n, target_size] (`configs.target_size`).

  Returns:
    float32 [n].

  Raises:
    ValueError: the spec's type is not registered (naming the spec).
  """
  readout_type = readout_types.get_readout_type(spec)
  return readout_type.loss(spec, tf.cast(predictions, tf.float32),
                           tf.cast(targets, tf.float32))


def loss_sums(specs: Mapping[str, configs.ReadoutSpec],
              predictions: Mapping[str, tf.Tensor],
              targets: Mapping[str, tf.Tensor],
              weights: Mapping[str, tf.Tensor]) -> Sums:
  """{task: (sum_i w_i l_i, sum_i w_i)} over the given queries.

  Args:
    specs: {task: ReadoutSpec}.
    predictions: {task: float [n_t, dim]}.
    targets: {task: float [n_t, >= target_size]}; extra columns (padding to
      the widest task) are ignored.
    weights: {task: float [n_t]} (>= 0; 0 for padding rows).

  Returns:
    {task: (float32 scalar, float32 scalar)}.
  """
  sums = {}
  for name, spec in specs.items():
    size = configs.target_size(spec)
    w = tf.cast(weights[name], tf.float32)
    keep = w > 0
    # Rows of weight 0 are zeroed BEFORE the loss as well as after it: a
    # masked row whose loss is not finite (e.g. exp of a large log-rate on
    # another task's row under static routing) would otherwise give a NaN
    # gradient (0 * inf) that poisons every shared weight.
    p = tf.where(keep[:, None], tf.cast(predictions[name], tf.float32), 0.0)
    y = tf.where(keep[:, None], tf.cast(targets[name][:, :size], tf.float32),
                 0.0)
    l = per_query_loss(spec, p, y)
    wl = tf.where(keep, w * l, tf.zeros_like(l))
    sums[name] = (tf.reduce_sum(wl), tf.reduce_sum(w))
  return sums


def task_losses(specs: Mapping[str, configs.ReadoutSpec], sums: Sums,
                weight_totals: Optional[Mapping[str, tf.Tensor]] = None
                ) -> Dict[str, tf.Tensor]:
  """Task losses and their weighted total.

  Args:
    specs: {task: ReadoutSpec}.
    sums: from `loss_sums`.
    weight_totals: {task: sum of weights over the global batch}; None: the
      local denominators of `sums` (single replica).

  Returns:
    {task: loss, ..., 'total_loss': sum_t loss_weight_t * loss_t}, float32
    scalars.
  """
  out = {}
  total = tf.constant(0.0, tf.float32)
  for name, spec in specs.items():
    numerator, denominator = sums[name]
    if weight_totals is not None:
      denominator = weight_totals[name]
    out[name] = tf.math.divide_no_nan(numerator, denominator)
    total += float(spec.loss_weight) * out[name]
  out['total_loss'] = total
  return out


def global_task_losses(specs: Mapping[str, configs.ReadoutSpec],
                       sums: Sums) -> Tuple[Dict[str, tf.Tensor],
                                            Dict[str, tf.Tensor]]:
  """This replica's share of the global-batch losses, and the global losses.

  In a replica context with several replicas, the weight sums are all-reduced
  so that the shares of all replicas add up to the global-batch loss (their
  gradients, summed by the optimizer, are the global batch's gradient).

  Returns:
    (share, global): two dicts as `task_losses` returns. With one replica both
    are the same.
  """
  context = tf.distribute.get_replica_context()
  replicas = tf.distribute.get_strategy().num_replicas_in_sync
  if context is None or replicas == 1:
    losses = task_losses(specs, sums)
    return losses, losses
  names = list(specs)
  totals = context.all_reduce(tf.distribute.ReduceOp.SUM,
                              [sums[n][1] for n in names])
  share = task_losses(specs, sums, dict(zip(names, totals)))
  keys = list(share)
  reduced = context.all_reduce(tf.distribute.ReduceOp.SUM,
                               [share[k] for k in keys])
  return share, dict(zip(keys, reduced))
