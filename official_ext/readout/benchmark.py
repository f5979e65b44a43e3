"""Readout layer throughput: padded vs chained (varlen) queries.

The same queries (same embeddings, same routing ids, same heads) are routed
once as a padded batch `[B, n_out, dim]` (padding to the batch's longest
sample, rounded up to a multiple of 8, padding id 0) and once chained
`[N, dim]` with a batch index, each under `tf.function`, in this process.
Query counts per sample are skewed (most samples short, a few long), as in
neural-decoding data, so padding is a large share of the padded batch.
Throughput counts real (non-padding) query rows per second; the outputs of
the two paths are checked equal before timing.

    python -m official_ext.readout.benchmark [--quick]
"""
import json
import sys
import time
from typing import Callable, Dict

import numpy as np
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official_ext.readout import configs
from official_ext.readout.modeling import multitask_readout


def _best_rate(fn: Callable[[], object], rows: int, min_seconds: float,
               repeats: int = 3) -> float:
  """Best over `repeats` of rows/second, each timing >= min_seconds."""
  fn()  # Trace and warm up.
  best = 0.0
  for _ in range(repeats):
    calls, start = 0, time.perf_counter()
    while True:
      out = fn()
      calls += 1
      elapsed = time.perf_counter() - start
      if elapsed >= min_seconds:
        break
    tf.nest.map_structure(lambda t: t.numpy(), out)
    best = max(best, rows * calls / elapsed)
  return best


def run(quick: bool = False) -> Dict[str, float]:
  """Measures the readout layer, padded vs varlen; returns the figures.

  Args:
    quick: tiny sizes and short timings (a smoke test, seconds).

  Returns:
    {'padded_rows_per_sec', 'varlen_rows_per_sec', 'varlen_speedup'
     (varlen / padded), 'num_samples', 'num_queries', 'padded_rows',
     'padding_fraction', 'dim'}.
  """
  rng = np.random.default_rng(0)
  batch, max_queries, dim = (8, 16, 16) if quick else (256, 512, 128)
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
  padded_rate = _best_rate(lambda: padded_fn(padded, padded_index), rows,
                           min_seconds)
  varlen_rate = _best_rate(
      lambda: varlen_fn(chained, chained_index, batch_index), rows,
      min_seconds)
  return {
      'padded_rows_per_sec': padded_rate,
      'varlen_rows_per_sec': varlen_rate,
      'varlen_speedup': varlen_rate / padded_rate,
      'num_samples': int(batch),
      'num_queries': rows,
      'padded_rows': int(batch * length),
      'padding_fraction': 1.0 - rows / float(batch * length),
      'dim': int(dim),
  }


if __name__ == '__main__':
  print(json.dumps(run(quick='--quick' in sys.argv[1:]), indent=2))
