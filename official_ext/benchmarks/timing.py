"""The one timing helper of the benchmarks: candidates timed in alternating
rounds in one process, medians (`interleaved_samples`, `interleaved_seconds`),
each round on a quiet machine (`QuietGate`); nothing else here calls a clock
around a step."""
import dataclasses
import gc
import os
import statistics
import time
from typing import (Any, Callable, Dict, List, Mapping, Optional, Sequence,
                    Tuple)

import tensorflow as tf


def block(value) -> None:
  """Waits for every tensor in `value` (a nested structure) to be computed.

  Leaves that are not tensors (numbers, numpy arrays) are already computed.
  """
  for t in tf.nest.flatten(value):
    if hasattr(t, 'numpy'):
      t.numpy()


@dataclasses.dataclass
class PerRound:
  """A candidate made anew for each of its rounds and closed after it, so that
  none of its work runs while another candidate is timed (a `tf.data`
  iterator's prefetching threads): `open()` returns the zero-argument step,
  called `warmup` times untimed before the round's timing starts."""
  open: Callable[[], Callable[[], object]]
  close: Callable[[], None]
  warmup: int = 0

  def start(self) -> Callable[[], object]:
    step = self.open()
    for _ in range(self.warmup):
      block(step())
    return step


def per_round_iterator(dataset: tf.data.Dataset, warmup: int) -> PerRound:
  """`dataset` as a `PerRound` candidate: each round a new iterator (one
  element per call, `warmup` taken first), deleted after the round."""
  live = []

  def open_():
    live.append(iter(dataset))
    return lambda: next(live[-1])

  def close():
    live.clear()
    gc.collect()  # The iterator's threads stop when it is deleted.

  return PerRound(open_, close, warmup)


class BusyMachineError(RuntimeError):
  """Other processes kept the machine busy past `QuietGate.max_wait_s`."""


def _pids_and_parents() -> Dict[int, int]:
  out = {}
  for name in os.listdir('/proc'):
    if name.isdigit():
      try:
        with open(f'/proc/{name}/stat') as f:
          stat = f.read()
      except OSError:
        continue
      out[int(name)] = int(stat[stat.rindex(')') + 2:].split()[1])
  return out


def _process_cpu_seconds(pid: int) -> float:
  """utime + stime + cutime + cstime of `pid` (0 if it is gone)."""
  try:
    with open(f'/proc/{pid}/stat') as f:
      stat = f.read()
  except OSError:
    return 0.0
  fields = stat[stat.rindex(')') + 2:].split()
  return sum(int(v) for v in fields[11:15]) / os.sysconf('SC_CLK_TCK')


def own_cpu_seconds() -> float:
  """CPU seconds of this process and its descendants, live or reaped (Linux)."""
  parents = _pids_and_parents()
  tree, frontier = set(), {os.getpid()}
  while frontier:
    tree |= frontier
    frontier = {p for p, pp in parents.items() if pp in frontier} - tree
  return sum(_process_cpu_seconds(p) for p in tree)


def machine_cpu_seconds() -> float:
  """CPU seconds every process has used since boot (/proc/stat; not idle,
  not iowait)."""
  with open('/proc/stat') as f:
    fields = [int(v) for v in f.readline().split()[1:9]]
  user, nice, system, _, _, irq, softirq, steal = fields
  return (user + nice + system + irq + softirq + steal) / os.sysconf(
      'SC_CLK_TCK')


def can_gate() -> bool:
  """Whether this machine exposes what `QuietGate` reads (/proc, Linux)."""
  return os.path.exists('/proc/stat') and os.path.exists('/proc/self/stat')


class _OtherLoad:
  """Other processes' CPU (in cores) from `start()` to `cores()`."""

  def start(self) -> None:
    self._t = time.perf_counter()
    self._machine = machine_cpu_seconds()
    self._own = own_cpu_seconds()

  def cores(self) -> float:
    seconds = time.perf_counter() - self._t
    other = (machine_cpu_seconds() - self._machine) - (
        own_cpu_seconds() - self._own)
    return max(other, 0.0) / max(seconds, 1e-9)


@dataclasses.dataclass
class QuietGate:
  """When a timed round counts: other processes (not this one, not its
  children) used at most `max_other_cores` of CPU on average over the round,
  and over a `probe_s` window just before it. A round above is retaken after
  the machine is quiet again; a machine not quiet within `max_wait_s`, or a
  round retaken `retries` times, raises `BusyMachineError`. With `enforce`
  False, rounds are recorded, never waited for or retaken (quick runs).
  `os.getloadavg()` (1 minute) is recorded before and after every round; it
  counts this process's own threads, so it is not what the gate reads."""
  max_other_cores: float = 0.15
  probe_s: float = 0.5
  max_wait_s: float = 900.0
  retries: int = 5
  enforce: bool = True

  def wait_for_quiet(self) -> float:
    """Seconds waited until a `probe_s` window had other processes below
    `max_other_cores`.

    Raises:
      BusyMachineError: not within `max_wait_s`, naming the load."""
    start = time.perf_counter()
    load = _OtherLoad()
    while True:
      load.start()
      time.sleep(self.probe_s)
      cores = load.cores()
      if cores <= self.max_other_cores:
        return time.perf_counter() - start
      waited = time.perf_counter() - start
      if waited >= self.max_wait_s:
        raise BusyMachineError(
            f'other processes used {cores:.2f} cores (more than the '
            f'benchmark\'s threshold of {self.max_other_cores}) for '
            f'{waited:.0f} s (1-minute loadavg {os.getloadavg()[0]:.2f}); no '
            'figure taken. Stop them, or run later.')
      time.sleep(min(5.0, self.max_wait_s - waited))


# The gate of every `interleaved_samples` call (`set_gate`); None: none.
_GATE: Optional[QuietGate] = None
# Every timed round since `take_rounds`: {'candidates', 'seconds',
# 'loadavg_before', 'loadavg_after', 'other_cores', 'waited_s', 'retaken'}.
_ROUNDS: List[Dict[str, Any]] = []


def set_gate(gate: Optional[QuietGate]) -> Optional[QuietGate]:
  """Makes `gate` every round's (None: none, and no record); returns the
  previous one."""
  global _GATE
  previous, _GATE = _GATE, gate
  return previous


def current_gate() -> Optional[QuietGate]:
  """The gate `set_gate` set (None: none)."""
  return _GATE


def add_rounds(rounds: Sequence[Dict[str, Any]]) -> None:
  """Records rounds a child process timed (its `take_rounds`)."""
  _ROUNDS.extend(rounds)


def take_rounds() -> List[Dict[str, Any]]:
  """The rounds recorded since the last call (and forgets them)."""
  rounds = list(_ROUNDS)
  _ROUNDS.clear()
  return rounds


def rounds_summary(rounds: Sequence[Dict[str, Any]],
                   gate: Optional[QuietGate]) -> Dict[str, Any]:
  """The JSON's 'timed_rounds' figure: the gate and the worst round."""
  def worst(key):
    return max((r[key] for r in rounds), default=None)
  return {'gate': dataclasses.asdict(gate) if gate else None,
          'rounds': len(rounds),
          'retaken': sum(r['retaken'] for r in rounds),
          'waited_s': round(sum(r['waited_s'] for r in rounds), 1),
          'max_other_cores': worst('other_cores'),
          'max_loadavg_before': worst('loadavg_before'),
          'max_loadavg_after': worst('loadavg_after'),
          'each': list(rounds)}


def _timed_round(candidates, calls_per_round, min_seconds):
  out = {}
  for name, candidate in candidates.items():
    per_round = isinstance(candidate, PerRound)
    try:
      fn = candidate.start() if per_round else candidate
      calls = 0
      start = time.perf_counter()
      while True:
        result = fn()
        calls += 1
        if (calls >= calls_per_round and
            time.perf_counter() - start >= min_seconds):
          break
      block(result)
      out[name] = (time.perf_counter() - start) / calls
    finally:
      if per_round:
        candidate.close()
  return out


def _gated_round(candidates, calls_per_round, min_seconds, gate):
  if gate is None:
    return _timed_round(candidates, calls_per_round, min_seconds)
  load, waited, retaken = _OtherLoad(), 0.0, 0
  while True:
    if gate.enforce:
      waited += gate.wait_for_quiet()
    before = os.getloadavg()[0]
    load.start()
    start = time.perf_counter()
    samples = _timed_round(candidates, calls_per_round, min_seconds)
    seconds = time.perf_counter() - start
    cores = load.cores()
    if not gate.enforce or cores <= gate.max_other_cores:
      break
    if retaken >= gate.retries:
      raise BusyMachineError(
          f'other processes used {cores:.2f} cores during a timed round of '
          f'{seconds:.1f} s (threshold {gate.max_other_cores}), retaken '
          f'{retaken} times; no figure taken.')
    retaken += 1
  _ROUNDS.append({'candidates': list(candidates), 'seconds': round(seconds, 3),
                  'loadavg_before': round(before, 2),
                  'loadavg_after': round(os.getloadavg()[0], 2),
                  'other_cores': round(cores, 3),
                  'waited_s': round(waited, 1), 'retaken': retaken})
  return samples


def interleaved_samples(candidates: Mapping[str, Callable[[], object]],
                        rounds: int = 5, calls_per_round: int = 1,
                        warmup: int = 2, min_seconds: float = 0.0
                        ) -> Dict[str, List[float]]:
  """Seconds per call of each candidate, one sample per round, interleaved:
  after `warmup` untimed calls of each, every round times each candidate in
  turn over `calls_per_round` calls and more until `min_seconds` passed, its
  last output waited for (`block`).

  Args:
    candidates: name -> zero-argument callable (one step), or a `PerRound`
      (opened for each round; its warm-up is a round of its own, untimed).
    rounds, calls_per_round: >= 1.
    warmup: untimed calls of each candidate first (>= 0).
    min_seconds: a sample's least duration (0: exactly `calls_per_round`).

  Returns:
    name -> `rounds` samples, seconds per call, in round order.

  Raises:
    BusyMachineError: the gate (`set_gate`) found the machine busy."""
  if rounds < 1 or calls_per_round < 1 or warmup < 0:
    raise ValueError(f'interleaved timing needs rounds >= 1, calls_per_round '
                     f'>= 1 and warmup >= 0; got rounds={rounds}, '
                     f'calls_per_round={calls_per_round}, warmup={warmup}')
  for candidate in candidates.values():
    if isinstance(candidate, PerRound):
      if warmup:
        _timed_round({'warmup': candidate}, warmup, 0.0)
      continue
    for _ in range(warmup):
      block(candidate())
  samples: Dict[str, List[float]] = {name: [] for name in candidates}
  for _ in range(rounds):
    timed = _gated_round(candidates, calls_per_round, min_seconds, _GATE)
    for name, sec in timed.items():
      samples[name].append(sec)
  return samples


def interleaved_children(
    makers: Mapping[str, Callable[[], Any]], rounds: int,
    check: Optional[Callable[[str, Dict[str, Any]], Optional[str]]] = None
) -> Tuple[Dict[str, List[float]], Dict[str, Dict[str, Any]]]:
  """Long-lived children (`memory.StepChild`s, or anything with
  `wait_ready`, `step` and `close`), made in order by `makers`, their steps
  timed in interleaved rounds (no warm-up: a child warms up before READY),
  every child closed after: (samples, each child's READY dict).

  Raises:
    ValueError: `check(name, ready)` said why a child is not the one asked
      for."""
  children = {}
  try:
    for name, make in makers.items():
      children[name] = make()
    ready = {k: c.wait_ready() for k, c in children.items()}
    for name, r in ready.items():
      problem = check(name, r) if check else None
      if problem:
        raise ValueError(problem)
    samples = interleaved_samples({k: c.step for k, c in children.items()},
                                  rounds=rounds, warmup=0)
  finally:
    for child in children.values():
      child.close()
  return samples, ready


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
