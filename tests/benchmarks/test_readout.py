"""The readout benchmark: quick runs report the sizes asked for."""
import tempfile

import numpy as np
import pytest
import tensorflow as tf

from official_ext.benchmarks import readout as benchmark
from official_ext.readout import demo_data


def test_quick_run_reports_the_sizes_asked_for():
  f = benchmark.run_heads(quick=True)
  assert set(f) == {'padded_rows_per_sec', 'varlen_rows_per_sec',
                    'varlen_speedup', 'num_samples', 'num_queries',
                    'padded_rows', 'padding_fraction', 'dim', 'max_queries'}
  for key in ('num_samples', 'num_queries', 'padded_rows', 'dim',
              'max_queries'):
    assert type(f[key]) is int, key  # pylint: disable=unidiomatic-typecheck
  for key in ('padded_rows_per_sec', 'varlen_rows_per_sec', 'varlen_speedup',
              'padding_fraction'):
    assert isinstance(f[key], float), key
  assert benchmark.QUICK == (8, 16, 16)
  assert (f['num_samples'], f['max_queries'], f['dim']) == (8, 16, 16)
  # The longest sample has all 16 queries, already a multiple of 8, so the
  # padded batch is 8 samples x 16 rows.
  assert f['padded_rows'] == 8 * 16
  # The query counts drawn with the benchmark's seed: 16 for the first
  # sample, clipped geometric(p = 4/16) for the others.
  counts = np.clip(np.random.default_rng(0).geometric(4 / 16, 8), 1, 16)
  counts[0] = 16
  assert f['num_queries'] == int(counts.sum())
  assert 16 + 7 <= f['num_queries'] < 8 * 16
  assert f['padding_fraction'] == pytest.approx(1 - f['num_queries'] / 128)
  assert f['varlen_speedup'] == pytest.approx(
      f['varlen_rows_per_sec'] / f['padded_rows_per_sec'], rel=1e-12)


def _round_up_8(n):
  return -(-n // 8) * 8


def test_quick_whole_model_run_counts_the_demo_queries():
  # Without the memory children (`python -m official_ext.benchmark readout
  # --quick` runs them); the padded and chained steps' outputs, loss and
  # gradients are checked equal inside `run_model` before timing.
  f = benchmark.run_model(quick=True, memory=False)
  assert not any('peak' in k for k in f)
  assert benchmark.QUICK_MODEL == (6, 8, 2, 1, 8)
  assert (f['model_num_samples'], f['model_hidden_size']) == (6, 8)
  # The first 6 demo trials, read here from the records themselves.
  queries, tokens = [], []
  for record in demo_data.generate_trials(6, seed=0, split_id=1):
    feature = tf.train.Example.FromString(record).features.feature
    queries.append(len(feature['output_task_ids'].int64_list.value))
    tokens.append(len(feature['input_timestamps'].float_list.value))
  assert f['model_num_queries'] == sum(queries)
  assert f['model_padded_rows'] == 6 * _round_up_8(max(queries))
  assert f['model_input_tokens'] == _round_up_8(max(tokens))
  assert f['model_padding_fraction'] == pytest.approx(
      1 - sum(queries) / f['model_padded_rows'], rel=1e-12)
  assert 0 < f['model_padding_fraction'] < 1
  assert f['model_varlen_speedup'] == pytest.approx(
      f['model_varlen_rows_per_sec'] / f['model_padded_rows_per_sec'],
      rel=1e-12)
  # The shared encoder part bounds the speed-up: padded step / encoder.
  assert f['model_encoder_share_of_padded'] > 0
  assert f['model_varlen_speedup_bound'] == pytest.approx(
      1 / f['model_encoder_share_of_padded'], rel=1e-12)


def test_memory_child_program_calls_this_module(monkeypatch, capsys):
  # The child process runs this program; here it runs in this process with
  # `memory_child` replaced (a real child costs a TensorFlow start-up).
  calls = []
  monkeypatch.setattr(benchmark, 'memory_child',
                      lambda *args: calls.append(args) or {'step_peak_mb': 2})
  code = benchmark.memory_child_code('varlen', True)
  exec(code, {})  # pylint: disable=exec-used
  assert calls == [('varlen', True)]
  assert capsys.readouterr().out == 'RESULT {"step_peak_mb": 2}\n'


def test_quick_spike_token_run_counts_the_spike_tokens():
  # Without the memory children; the padded and chained steps' losses and
  # gradients are checked equal inside `run_spike_tokens` before timing.
  f = benchmark.run_spike_tokens(quick=True, memory=False)
  assert not any('peak' in k for k in f)
  size = benchmark.QUICK_SPIKES
  assert (f['spike_num_samples'], f['spike_units'], f['spike_num_latents'],
          f['spike_hidden_size']) == (size.batch, size.units,
                                      size.num_latents, size.hidden_size)
  # The windows' spikes, read from the records themselves: one token each.
  vocabulary = benchmark.spike_vocabulary(quick=True)
  tokens, queries = [], 0
  for record in benchmark.spike_records(True, vocabulary):
    feature = tf.train.Example.FromString(record).features.feature
    ids = list(feature['input_unit_ids'].int64_list.value)
    assert set(ids) <= set(range(1, size.units + 1))
    assert feature['input_values'].float_list.value == [1.0] * len(ids)
    tokens.append(len(ids))
    queries += len(feature['output_task_ids'].int64_list.value)
  assert f['spike_tokens'] == sum(tokens) > 0
  assert f['spike_padded_tokens'] == size.batch * _round_up_8(max(tokens))
  assert f['spike_num_queries'] == queries
  assert f['spike_token_padding_fraction'] == pytest.approx(
      1 - sum(tokens) / f['spike_padded_tokens'], rel=1e-12)
  for batching in ('padded', 'varlen'):
    assert f[f'spike_{batching}_tokens_per_sec'] == pytest.approx(
        sum(tokens) / f[f'spike_{batching}_sec_per_step'], rel=1e-12)
  assert f['spike_varlen_speedup'] == pytest.approx(
      f['spike_padded_sec_per_step'] / f['spike_varlen_sec_per_step'],
      rel=1e-12)


def test_full_spike_size_is_a_recording_of_200_units():
  assert benchmark.SPIKES[:5] == (64, 200, 1.0, 20.0, 128)


def test_an_unknown_case_is_named():
  with pytest.raises(ValueError, match=r"unknown readout case\(s\) \['x'\]"):
    benchmark.run(quick=True, cases=['x'])


def test_spike_memory_child_program_calls_this_module(monkeypatch, capsys):
  calls = []
  monkeypatch.setattr(benchmark, 'spike_memory_child',
                      lambda *args: calls.append(args) or {'step_peak_mb': 3})
  exec(benchmark.spike_memory_child_code('padded', True), {})  # pylint: disable=exec-used
  assert calls == [('padded', True)]
  assert capsys.readouterr().out == 'RESULT {"step_peak_mb": 3}\n'


def test_first_trials_of_a_chained_spike_batch_keep_their_tokens():
  # The memory child's warm-up step runs on the first trials: per-trial
  # keys (tokens, unit ids, session ids) are sliced, per-query keys masked.
  with tempfile.TemporaryDirectory() as folder:
    _, _, batches = benchmark._spike_setup(True, folder)  # pylint: disable=protected-access
  batch = batches['varlen']
  first = benchmark.first_trials(batch, 2)
  for key in ('input_values', 'input_timestamps', 'input_mask',
              'input_unit_ids', 'session_ids'):
    np.testing.assert_array_equal(first[key], batch[key][:2], err_msg=key)
  keep = batch['output_batch_index'].numpy() < 2
  for key in ('output_batch_index', 'output_readout_index',
              'output_targets'):
    np.testing.assert_array_equal(first[key], batch[key].numpy()[keep],
                                  err_msg=key)
