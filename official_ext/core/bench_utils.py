"""Timing helpers for `official_ext.benchmark`: interleaved, ratio-first.

The machines this runs on are shared and noisy, so every comparison times the
candidates in alternating rounds in one process and reports medians; the
ratio of two medians measured side by side is the figure to trust.
"""
import statistics
import time
from typing import Callable, Dict, List, Mapping, Sequence

import tensorflow as tf


def block(value) -> None:
  """Waits for every tensor in `value` (a nested structure) to be computed."""
  for t in tf.nest.flatten(value):
    if hasattr(t, 'numpy'):
      t.numpy()


def interleaved_seconds(candidates: Mapping[str, Callable[[], object]],
                        rounds: int = 5, calls_per_round: int = 1,
                        warmup: int = 2) -> Dict[str, float]:
  """Median seconds per call of each candidate, timed in alternating rounds.

  Args:
    candidates: name -> zero-argument callable (one step).
    rounds: rounds; each round times every candidate once in turn.
    calls_per_round: calls per timing (their mean is one sample).
    warmup: untimed calls of each candidate first (tracing, autotuning).

  Returns:
    name -> median seconds per call.
  """
  for fn in candidates.values():
    for _ in range(warmup):
      block(fn())
  samples: Dict[str, List[float]] = {name: [] for name in candidates}
  for _ in range(rounds):
    for name, fn in candidates.items():
      start = time.perf_counter()
      for _ in range(calls_per_round):
        out = fn()
      block(out)
      samples[name].append((time.perf_counter() - start) / calls_per_round)
  return {name: statistics.median(s) for name, s in samples.items()}


def matmul_peak_gflops(sizes: Sequence[int] = (2048, 3072), repeats: int = 8
                       ) -> float:
  """Best fp32 GFLOP/s of a square tf.matmul on this machine, this run."""
  best = 0.0
  for n in sizes:
    a = tf.random.uniform([n, n])
    b = tf.random.uniform([n, n])
    fn = tf.function(lambda a=a, b=b: tf.matmul(a, b))
    block(fn())
    for _ in range(repeats):
      start = time.perf_counter()
      block(fn())
      best = max(best, 2.0 * n ** 3 / (time.perf_counter() - start) / 1e9)
  return best


def format_table(rows: Sequence[Sequence[str]]) -> str:
  """A markdown table; the first row is the header."""
  widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
  lines = []
  for j, row in enumerate(rows):
    lines.append('| ' + ' | '.join(str(c).ljust(w) for c, w in
                                   zip(row, widths)) + ' |')
    if j == 0:
      lines.append('|' + '|'.join('-' * (w + 2) for w in widths) + '|')
  return '\n'.join(lines)
