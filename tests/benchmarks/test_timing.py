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
