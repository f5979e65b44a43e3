"""Readout layer throughput: padded vs chained (varlen) queries.

The same queries (same embeddings, same routing ids, same heads) are routed
once as a padded batch `[B, n_out, dim]` (padding to the batch's longest
sample, rounded up to a multiple of 8, padding id 0) and once chained
`[N, dim]` with a batch index, each under `tf.function`, in this process.
Query counts per sample are skewed (most samples short, a few long), as in
neural-decoding data, so padding is a large share of the padded batch.
Throughput counts real (non-padding) query rows per second; the outputs of
the two paths are checked equal before timing. The two are timed
interleaved (`timing.interleaved_seconds`: one warm-up call each, 3 rounds,
each sample at least `min_seconds` of back-to-back calls; medians).

    python -m official_ext.benchmark readout [--quick]
"""
from typing import Dict, NamedTuple

import numpy as np
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official_ext.benchmarks import timing
from official_ext.readout import configs
from official_ext.readout.modeling import multitask_readout


class Size(NamedTuple):
  """Samples per batch, the most queries of one sample, embedding width."""
  batch: int
  max_queries: int
  dim: int


FULL = Size(batch=256, max_queries=512, dim=128)
QUICK = Size(batch=8, max_queries=16, dim=16)


def run(quick: bool = False) -> Dict[str, float]:
  """Measures the readout layer, padded vs varlen; returns the figures.

  Args:
    quick: `QUICK` sizes and short timings (a smoke test, seconds) instead
      of `FULL`.

  Returns:
    {'padded_rows_per_sec', 'varlen_rows_per_sec', 'varlen_speedup'
     (varlen / padded), 'num_samples', 'num_queries', 'padded_rows',
     'padding_fraction', 'dim', 'max_queries'}: rates are real query rows
    per second (medians), counts are ints.
  """
  rng = np.random.default_rng(0)
  batch, max_queries, dim = QUICK if quick else FULL
  min_seconds = 0.05 if quick else 1.0
  specs = configs.DEMO_READOUTS
  layer = multitask_readout.MultitaskReadout(
      specs, configs.task_index(configs.DEMO_VOCABULARY))
  # Skewed lengths: geometric-like, clipped to [1, max_queries].
  counts = np.clip(rng.geometric(4.0 / max_queries, batch), 1, max_queries)
  counts[0] = max_queries  # One long sample sets the padded length.
  length = int(-(-counts.max() // 8) * 8)
  num_ids = len(configs.DEMO_VOCABULARY)
  index = np.zeros([batch, length], np.int32)
  embs = np.zeros([batch, length, dim], np.float32)
  for i, n in enumerate(counts):
    index[i, :n] = rng.integers(1, num_ids + 1, n)
    embs[i, :n] = rng.normal(size=[n, dim])
  valid = index != 0
  chained = tf.constant(embs[valid])
  chained_index = tf.constant(index[valid])
  batch_index = tf.constant(np.nonzero(valid)[0].astype(np.int32))
  padded, padded_index = tf.constant(embs), tf.constant(index)

  padded_fn = tf.function(lambda e, i: layer(e, i))
  varlen_fn = tf.function(lambda e, i, b: layer.call_varlen(e, i, b))
  a = padded_fn(padded, padded_index)
  b = varlen_fn(chained, chained_index, batch_index)
  for name in a:
    np.testing.assert_allclose(a[name].numpy(), b[name].numpy(), rtol=1e-5,
                               atol=1e-5, err_msg=name)
  rows = int(valid.sum())
  seconds = timing.interleaved_seconds({
      'padded': lambda: padded_fn(padded, padded_index),
      'varlen': lambda: varlen_fn(chained, chained_index, batch_index),
  }, rounds=3, warmup=1, min_seconds=min_seconds)
  padded_rate = rows / seconds['padded']
  varlen_rate = rows / seconds['varlen']
  return {
      'padded_rows_per_sec': padded_rate,
      'varlen_rows_per_sec': varlen_rate,
      'varlen_speedup': varlen_rate / padded_rate,
      'num_samples': int(batch),
      'num_queries': rows,
      'padded_rows': int(batch * length),
      'padding_fraction': 1.0 - rows / float(batch * length),
      'dim': int(dim),
      'max_queries': int(max_queries),
  }

