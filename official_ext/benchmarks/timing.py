"""The one timing helper of the benchmarks: candidates timed in alternating
rounds in one process, medians (`interleaved_samples`, `interleaved_seconds`);
nothing else here calls a clock around a step."""
import statistics
import time
from typing import Callable, Dict, List, Mapping, Sequence

import tensorflow as tf


def block(value) -> None:
  """Waits for every tensor in `value` (a nested structure) to be computed.

  Leaves that are not tensors (numbers, numpy arrays) are already computed.
  """
  for t in tf.nest.flatten(value):
    if hasattr(t, 'numpy'):
      t.numpy()


def interleaved_samples(candidates: Mapping[str, Callable[[], object]],
                        rounds: int = 5, calls_per_round: int = 1,
                        warmup: int = 2, min_seconds: float = 0.0
                        ) -> Dict[str, List[float]]:
  """Seconds per call of each candidate, one sample per round, interleaved:
  after `warmup` untimed calls of each, every round times each candidate in
  turn over `calls_per_round` calls and more until `min_seconds` passed, its
  last output waited for (`block`).

  Args:
    candidates: name -> zero-argument callable (one step).
    rounds, calls_per_round: >= 1.
    warmup: untimed calls of each candidate first (>= 0).
    min_seconds: a sample's least duration (0: exactly `calls_per_round`).

  Returns:
    name -> `rounds` samples, seconds per call, in round order."""
  if rounds < 1 or calls_per_round < 1 or warmup < 0:
    raise ValueError(f'interleaved timing needs rounds >= 1, calls_per_round '
                     f'>= 1 and warmup >= 0; got rounds={rounds}, '
                     f'calls_per_round={calls_per_round}, warmup={warmup}')
  for fn in candidates.values():
    for _ in range(warmup):
      block(fn())
  samples: Dict[str, List[float]] = {name: [] for name in candidates}
  for _ in range(rounds):
    for name, fn in candidates.items():
      calls = 0
      start = time.perf_counter()
      while True:
        out = fn()
        calls += 1
        if (calls >= calls_per_round and
            time.perf_counter() - start >= min_seconds):
          break
      block(out)
      samples[name].append((time.perf_counter() - start) / calls)
  return samples


def interleaved_seconds(candidates: Mapping[str, Callable[[], object]],
                        rounds: int = 5, calls_per_round: int = 1,
                        warmup: int = 2, min_seconds: float = 0.0
                        ) -> Dict[str, float]:
  """Median seconds per call of each candidate (`interleaved_samples`, whose
  arguments these are)."""
  samples = interleaved_samples(candidates, rounds=rounds,
                                calls_per_round=calls_per_round,
                                warmup=warmup, min_seconds=min_seconds)
  return {name: statistics.median(s) for name, s in samples.items()}


def matmul_flops(n: int) -> int:
  """FLOPs of one [n, n] x [n, n] matmul (multiply-add = 2 FLOPs)."""
  return 2 * n ** 3


def matmul_peak_gflops(sizes: Sequence[int] = (2048, 3072), repeats: int = 8
                       ) -> float:
  """Best fp32 GFLOP/s of a square tf.matmul on this machine, this run.

  The sizes are timed interleaved (`interleaved_samples`, one warm-up call,
  `repeats` rounds); the figure is the fastest sample of any size: a peak.
  """
  candidates = {}
  for n in sizes:
    a = tf.random.uniform([n, n])
    b = tf.random.uniform([n, n])
    candidates[str(n)] = tf.function(lambda a=a, b=b: tf.matmul(a, b))
  samples = interleaved_samples(candidates, rounds=repeats, warmup=1)
  return max(matmul_flops(int(n)) / min(s) / 1e9 for n, s in samples.items())


def matmul_candidate(n: int = 3072) -> Callable[[], tf.Tensor]:
  """One [n, n] x [n, n] fp32 tf.matmul, as a candidate: timed in a step's
  rounds, the matmul rate of the moments the step was timed in (steadier on a
  machine whose speed drifts than `matmul_peak_gflops` at the run's start)."""
  a = tf.random.uniform([n, n])
  b = tf.random.uniform([n, n])
  return tf.function(lambda: tf.matmul(a, b))


def cpu_allocator() -> str:
  """'bfc' when TensorFlow's CPU allocator is the BFC (pooling) allocator
  (`TF_CPU_ALLOCATOR_USE_BFC=true` when the runtime started), else 'default'
  (each tensor allocated with malloc, large ones fresh from the kernel)."""
  try:
    tf.config.experimental.get_memory_info('CPU:0')
  except ValueError:  # 'Allocator stats not available': not BFC.
    return 'default'
  return 'bfc'


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
