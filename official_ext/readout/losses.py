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
Total loss (`ReadoutTaskConfig.loss_weighting`):

* 'weighted_sum': sum over tasks of `loss_weight * task loss`.
* 'sample_share': sum over tasks of `loss_weight * (n_t / n) * task loss`,
  n_t the samples (trials) of the global batch that hold a query of the task
  of positive weight, n the samples of the global batch (padding trials of an
  evaluation excluded). torch_brain's POYO+ training step scales each task
  loss by the sequences holding one of its queries over the batch size; it
  counts queries whatever their weight and has no loss_weight.

A continuous readout with `normalize_mean` / `normalize_std` is scored
against its normalised targets (y - mean) / std (`configs.normalize_targets`).

Under a distribution strategy every replica holds part of each task's queries.
`loss_sums` returns the numerator and denominator per task so the caller can
sum the denominators over replicas (`global_task_losses`): the replicas'
losses then add up to the loss of the global batch exactly. The sample counts
of 'sample_share' (`sample_counts`) are summed over replicas the same way.
"""
from typing import Dict, Mapping, Optional, Tuple

import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official_ext.readout import configs
from official_ext.readout import readout_types

Sums = Dict[str, Tuple[tf.Tensor, tf.Tensor]]
# ({task: samples holding the task}, samples): see `sample_counts`.
Counts = Tuple[Dict[str, tf.Tensor], tf.Tensor]


def per_query_loss(spec: configs.ReadoutSpec, predictions: tf.Tensor,
                   targets: tf.Tensor) -> tf.Tensor:
  """Unweighted loss of each query: the loss of the spec's readout type
  (`readout_types`).

  Args:
    spec: the task's ReadoutSpec.
    predictions: float [n, dim] head outputs.
    targets: float [n, target_size] (`readout_types.target_size`).

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
    targets: {task: float [n_t, >= target_size]}, in the target's units
      (normalised here for a spec with `normalize_mean`); extra columns
      (padding to the widest task) are ignored.
    weights: {task: float [n_t]} (>= 0; 0 for padding rows).

  Returns:
    {task: (float32 scalar, float32 scalar)}.
  """
  sums = {}
  for name, spec in specs.items():
    size = readout_types.target_size(spec)
    w = tf.cast(weights[name], tf.float32)
    keep = w > 0
    # Rows of weight 0 are zeroed BEFORE the loss as well as after it: a
    # masked row whose loss is not finite (e.g. exp of a large log-rate on
    # another task's row under static routing) would otherwise give a NaN
    # gradient (0 * inf) that poisons every shared weight.
    p = tf.where(keep[:, None], tf.cast(predictions[name], tf.float32), 0.0)
    y = tf.where(keep[:, None], configs.normalize_targets(
        spec, tf.cast(targets[name][:, :size], tf.float32)), 0.0)
    l = per_query_loss(spec, p, y)
    wl = tf.where(keep, w * l, tf.zeros_like(l))
    sums[name] = (tf.reduce_sum(wl), tf.reduce_sum(w))
  return sums


def sample_counts(specs: Mapping[str, configs.ReadoutSpec],
                  task_index: Mapping[str, int], readout_index: tf.Tensor,
                  weights: tf.Tensor, batch_index: Optional[tf.Tensor],
                  sample_mask: tf.Tensor) -> Counts:
  """Samples holding each task, and samples, of one (local) batch.

  Args:
    specs: {task: ReadoutSpec}.
    task_index: {task: routing id}.
    readout_index: int [B, n_out] (padded) or [N] (chained) routing ids.
    weights: float, the same shape: query weights (0: the query counts not).
    batch_index: int32 [N], the sample of each chained query; None: padded.
    sample_mask: bool [B], False for padding trials (they count nowhere).

  Returns:
    ({task: float32 number of samples with a query of the task of positive
    weight}, float32 number of samples).
  """
  mask = tf.cast(sample_mask, tf.float32)
  counts = {}
  for name in specs:
    holds = tf.cast(tf.logical_and(
        tf.equal(readout_index, task_index[name]), weights > 0), tf.float32)
    if batch_index is None:
      per_sample = tf.reduce_max(holds, axis=1)
    else:
      per_sample = tf.math.unsorted_segment_max(
          holds, batch_index, tf.shape(mask)[0])
      per_sample = tf.maximum(per_sample, 0.0)  # Empty segments: lowest().
    counts[name] = tf.reduce_sum(per_sample * mask)
  return counts, tf.reduce_sum(mask)


def task_losses(specs: Mapping[str, configs.ReadoutSpec], sums: Sums,
                weight_totals: Optional[Mapping[str, tf.Tensor]] = None,
                counts: Optional[Counts] = None) -> Dict[str, tf.Tensor]:
  """Task losses and their weighted total.

  Args:
    specs: {task: ReadoutSpec}.
    sums: from `loss_sums`.
    weight_totals: {task: sum of weights over the global batch}; None: the
      local denominators of `sums` (single replica).
    counts: 'sample_share' weighting: `sample_counts` over the global batch;
      None: 'weighted_sum'.

  Returns:
    {task: loss, ..., 'total_loss': sum_t loss_weight_t * loss_t (times
    n_t / n with `counts`)}, float32 scalars.
  """
  out = {}
  total = tf.constant(0.0, tf.float32)
  for name, spec in specs.items():
    numerator, denominator = sums[name]
    if weight_totals is not None:
      denominator = weight_totals[name]
    out[name] = tf.math.divide_no_nan(numerator, denominator)
    scale = float(spec.loss_weight)
    if counts is not None:
      scale *= tf.math.divide_no_nan(counts[0][name], counts[1])
    total += scale * out[name]
  out['total_loss'] = total
  return out


def global_task_losses(specs: Mapping[str, configs.ReadoutSpec],
                       sums: Sums, counts: Optional[Counts] = None
                       ) -> Tuple[Dict[str, tf.Tensor], Dict[str, tf.Tensor]]:
  """This replica's share of the global-batch losses, and the global losses.

  In a replica context with several replicas, the weight sums (and the sample
  `counts` of 'sample_share') are all-reduced so that the shares of all
  replicas add up to the global-batch loss (their gradients, summed by the
  optimizer, are the global batch's gradient).

  Args:
    specs: {task: ReadoutSpec}.
    sums: this replica's `loss_sums`.
    counts: this replica's `sample_counts` ('sample_share'); None:
      'weighted_sum'.

  Returns:
    (share, global): two dicts as `task_losses` returns. With one replica both
    are the same.
  """
  context = tf.distribute.get_replica_context()
  replicas = tf.distribute.get_strategy().num_replicas_in_sync
  if context is None or replicas == 1:
    losses = task_losses(specs, sums, counts=counts)
    return losses, losses
  names = list(specs)
  local = [sums[n][1] for n in names]
  if counts is not None:
    local += [counts[0][n] for n in names] + [counts[1]]
  totals = context.all_reduce(tf.distribute.ReduceOp.SUM, local)
  if counts is not None:
    counts = (dict(zip(names, totals[len(names):2 * len(names)])), totals[-1])
  share = task_losses(specs, sums, dict(zip(names, totals[:len(names)])),
                      counts)
  keys = list(share)
  reduced = context.all_reduce(tf.distribute.ReduceOp.SUM,
                               [share[k] for k in keys])
  return share, dict(zip(keys, reduced))
