"""The one timing helper: interleaving, call counts, medians (a fake clock)."""
import pytest

from official_ext.benchmarks import timing


class _Clock:
  """A perf_counter stand-in that moves only when a candidate runs."""

  def __init__(self):
    self.now = 0.0

  def __call__(self):
    return self.now


@pytest.fixture
def clock(monkeypatch):
  fake = _Clock()
  monkeypatch.setattr(timing.time, 'perf_counter', fake)
  return fake


def test_rounds_alternate_after_the_warmup(clock):
  calls = []

  def candidate(name, seconds):
    def fn():
      calls.append(name)
      clock.now += seconds
    return fn

  samples = timing.interleaved_samples(
      {'a': candidate('a', 1.0), 'b': candidate('b', 2.0)}, rounds=3,
      warmup=2)
  assert calls == ['a', 'a', 'b', 'b'] + ['a', 'b'] * 3
  assert samples == {'a': [1.0, 1.0, 1.0], 'b': [2.0, 2.0, 2.0]}


def test_a_sample_is_seconds_per_call_and_the_figure_their_median(clock):
  durations = iter([4.0, 4.0, 1.0, 1.0, 2.5, 2.5])  # 2 calls per round

  def fn():
    clock.now += next(durations)

  samples = timing.interleaved_samples({'x': fn}, rounds=3,
                                       calls_per_round=2, warmup=0)
  assert samples == {'x': [4.0, 1.0, 2.5]}
  durations = iter([4.0, 4.0, 1.0, 1.0, 2.5, 2.5])
  assert timing.interleaved_seconds({'x': fn}, rounds=3, calls_per_round=2,
                                    warmup=0) == {'x': 2.5}


def test_min_seconds_adds_calls_to_a_sample(clock):
  calls = []

  def fn():
    calls.append(1)
    clock.now += 0.25

  samples = timing.interleaved_samples({'x': fn}, rounds=2, warmup=1,
                                       min_seconds=1.0)
  # 1 warm-up call, then 4 calls of 0.25 s per round to reach 1 s.
  assert len(calls) == 1 + 2 * 4
  assert samples == {'x': [0.25, 0.25]}


def test_the_last_output_of_a_sample_is_waited_for(clock):
  class Pending:
    def __init__(self, seconds):
      self.seconds = seconds

    def numpy(self):  # What `block` calls: the work "finishes" here.
      clock.now += self.seconds

  # Dispatching is free, finishing costs 3 s: the sample includes it.
  samples = timing.interleaved_samples({'x': lambda: [Pending(3.0)]},
                                       rounds=1, warmup=0)
  assert samples == {'x': [3.0]}


def test_a_per_round_candidate_is_opened_warmed_and_closed_each_round(clock):
  events = []

  def per_round(name, seconds):
    def open_():
      events.append(f'open {name}')

      def step():
        events.append(name)
        clock.now += seconds
      return step
    return timing.PerRound(open_, lambda: events.append(f'close {name}'),
                           warmup=1)

  samples = timing.interleaved_samples(
      {'a': per_round('a', 1.0), 'b': per_round('b', 2.0)}, rounds=2,
      warmup=1)
  one_round = ['open a', 'a', 'a', 'close a', 'open b', 'b', 'b', 'close b']
  # An untimed round of each first; its warm-up call is outside the sample.
  assert events == one_round * 3
  assert samples == {'a': [1.0, 1.0], 'b': [2.0, 2.0]}


def test_a_per_round_candidate_whose_warmup_fails_is_closed(clock):
  events = []

  def open_():
    def step():
      raise StopIteration('empty')
    return step

  candidate = timing.PerRound(open_, lambda: events.append('close'),
                              warmup=1)
  with pytest.raises(StopIteration):
    timing.interleaved_samples({'a': candidate}, rounds=1, warmup=0)
  assert events == ['close']


@pytest.mark.parametrize('kwargs', [{'rounds': 0}, {'calls_per_round': 0},
                                    {'warmup': -1}])
def test_bad_counts_are_refused(kwargs):
  with pytest.raises(ValueError, match=next(iter(kwargs))):
    timing.interleaved_samples({'x': lambda: None}, **kwargs)


def test_matmul_flops_by_hand():
  # [3, 3] x [3, 3]: 9 outputs, 3 multiply-adds each, 2 FLOPs per one.
  assert timing.matmul_flops(3) == 9 * 3 * 2 == 54


def test_format_table():
  assert timing.format_table([('a', 'bb'), ('ccc', 'd')]) == (
      '| a   | bb |\n'
      '|-----|----|\n'
      '| ccc | d  |')


class _Machine:
  """Fake CPU counters: this process's and every process's CPU seconds."""

  def __init__(self, clock, monkeypatch):
    self.own = 0.0
    self.machine = 0.0
    self.other_cores = []  # Other processes' cores in each next interval.
    self.clock = clock
    monkeypatch.setattr(timing, 'own_cpu_seconds', lambda: self.own)
    monkeypatch.setattr(timing, 'machine_cpu_seconds', lambda: self.machine)
    monkeypatch.setattr(timing.time, 'sleep', self.advance)

  def advance(self, seconds, own_cores=0.0):
    self.clock.now += seconds
    other = self.other_cores.pop(0) if self.other_cores else 0.0
    self.own += own_cores * seconds
    self.machine += (own_cores + other) * seconds


@pytest.fixture
def gated():
  previous = timing.set_gate(None)
  yield
  timing.set_gate(previous)
  timing.take_rounds()


def test_a_round_while_other_processes_are_busy_is_retaken(
    clock, monkeypatch, gated):
  machine = _Machine(clock, monkeypatch)
  timing.set_gate(timing.QuietGate(max_other_cores=0.2, probe_s=0.5))
  timing.take_rounds()
  # Quiet probe, then 0.5 cores of others during the first round (retaken),
  # quiet probe, quiet second round.
  machine.other_cores = [0.0, 0.5, 0.0, 0.0]

  def step():
    machine.advance(2.0, own_cores=2.0)

  samples = timing.interleaved_samples({'x': step}, rounds=1, warmup=0)
  assert samples == {'x': [2.0]}
  rounds = timing.take_rounds()
  assert len(rounds) == 1
  assert rounds[0]['retaken'] == 1 and rounds[0]['other_cores'] == 0.0
  assert rounds[0]['candidates'] == ['x'] and rounds[0]['seconds'] == 2.0
  assert {'loadavg_before', 'loadavg_after'} <= set(rounds[0])
  summary = timing.rounds_summary(rounds, timing.QuietGate())
  assert summary['rounds'] == 1 and summary['retaken'] == 1
  assert summary['gate']['max_other_cores'] == 0.15


def test_a_machine_that_stays_busy_is_refused(clock, monkeypatch, gated):
  machine = _Machine(clock, monkeypatch)
  timing.set_gate(timing.QuietGate(max_other_cores=0.2, probe_s=0.5,
                                   max_wait_s=20.0))
  machine.other_cores = [1.0] * 1000
  with pytest.raises(timing.BusyMachineError,
                     match=r'other processes used 1.00 cores .* threshold of '
                     r'0.2\) for 2\d s'):
    timing.interleaved_samples({'x': lambda: None}, rounds=1, warmup=0)
  # Without enforcing (quick runs), the round is only recorded.
  timing.set_gate(timing.QuietGate(max_other_cores=0.2, enforce=False))
  timing.take_rounds()
  timing.interleaved_samples({'x': lambda: machine.advance(1.0)}, rounds=2,
                             warmup=0)
  assert [r['other_cores'] for r in timing.take_rounds()] == [1.0, 1.0]


def test_own_cpu_counts_children_and_the_machine_counts_all():
  import subprocess, sys  # pylint: disable=g-import-not-at-top,multiple-imports
  own, machine = timing.own_cpu_seconds(), timing.machine_cpu_seconds()
  subprocess.run([sys.executable, '-c', 'import time\nt = time.process_time()'
                  '\nwhile time.process_time() - t < 0.5: pass'], check=True)
  own_used = timing.own_cpu_seconds() - own
  assert 0.45 <= own_used <= 5.0
  assert timing.machine_cpu_seconds() - machine >= own_used - 0.05
