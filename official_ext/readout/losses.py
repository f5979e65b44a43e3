"""Readout losses: per-query losses by readout type, weighted per task and
summed into the total loss (docs/readout.md#the-model)."""
from typing import Dict, Mapping, Optional, Tuple

import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official_ext.readout import configs
from official_ext.readout import readout_types

Sums = Dict[str, Tuple[tf.Tensor, tf.Tensor]]
# ({task: samples holding the task}, samples): see `sample_counts`.
Counts = Tuple[Dict[str, tf.Tensor], tf.Tensor]


def per_query_loss(spec: configs.ReadoutSpec, predictions: tf.Tensor,
                   targets: tf.Tensor) -> tf.Tensor:
  """Unweighted float32 [n] loss of each query under the spec's readout type
  (predictions [n, dim], targets [n, target_size])."""
  readout_type = readout_types.get_readout_type(spec)
  return readout_type.loss(spec, tf.cast(predictions, tf.float32),
                           tf.cast(targets, tf.float32))


def loss_sums(specs: Mapping[str, configs.ReadoutSpec],
              predictions: Mapping[str, tf.Tensor],
              targets: Mapping[str, tf.Tensor],
              weights: Mapping[str, tf.Tensor]) -> Sums:
  """{task: (sum_i w_i l_i, sum_i w_i)}, float32 scalars.

  Targets {task: [n_t, >= target_size]} are in the target's units (normalised
  here); rows of weight 0 count nowhere, not even a non-finite one.
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
  """({task: samples holding a query of it of positive weight}, samples) of
  one batch; `batch_index` [N] for chained queries (None: padded), padding
  trials (`sample_mask` False) count nowhere."""
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
  """{task: loss, 'total_loss': sum_t loss_weight_t * loss_t}, float32.

  `weight_totals`: the global batch's weight sums (None: those of `sums`);
  `counts`: `sample_counts` for 'sample_share' (None: 'weighted_sum').
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
  """(this replica's share, the global-batch losses), as `task_losses`.

  The weight sums (and `counts`) are all-reduced, so the replicas' shares add
  up to the global batch's loss.
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
