"""`python -m official_ext.benchmark readout`: padded against chained (varlen)
queries, for the readout layer alone, the whole model's training step on demo
trials, and a unit-token model on spike windows (case `spike_tokens`); speed
and memory (docs/benchmarks.md#multitask-readout)."""
import os
import tempfile
from typing import Any, Dict, List, NamedTuple, Optional, Sequence

import numpy as np
import tensorflow as tf, tf_keras

from official_ext.benchmarks import memory as memory_lib
from official_ext.benchmarks import timing
from official_ext.core.kernels import kernel_policy
from official_ext.readout import configs
from official_ext.readout import dataloader
from official_ext.readout import demo_data
from official_ext.readout.modeling import multitask_readout
from official_ext.readout import task as task_lib
from official_ext.readout import unit_vocabulary as vocabulary_lib

# Settings of a `benchmark readout` process: those a CPU training run of the
# family takes (`core.kernels.kernel_policy`, as `python -m official_ext.train`
# applies them).
PROCESS_SETTINGS = kernel_policy.cpu_process_env('readout')


class Size(NamedTuple):
  """Samples per batch, the most queries of one sample, embedding width."""
  batch: int
  max_queries: int
  dim: int


FULL = Size(batch=256, max_queries=512, dim=128)
QUICK = Size(batch=8, max_queries=16, dim=16)


def run_heads(quick: bool = False) -> Dict[str, Any]:
  """The readout layer, padded vs varlen (`QUICK` sizes and short timings with
  `quick`, else `FULL`).

  Returns:
    {'padded_rows_per_sec', 'varlen_rows_per_sec' (real query rows, medians),
     'varlen_speedup' (varlen / padded), 'num_samples', 'num_queries',
     'padded_rows', 'padding_fraction', 'dim', 'max_queries'}."""
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



class ModelSize(NamedTuple):
  """Trials per batch and the encoder (the decoder has one block)."""
  batch: int
  hidden_size: int
  num_heads: int
  num_layers: int
  intermediate_size: int


# The demo's encoder (`configs.readout_demo_task`) on 256 trials.
MODEL = ModelSize(batch=256, hidden_size=64, num_heads=4, num_layers=2,
                  intermediate_size=128)
QUICK_MODEL = ModelSize(batch=6, hidden_size=8, num_heads=2, num_layers=1,
                        intermediate_size=8)
WARMUP_TRIALS = 2
BATCHINGS = ('padded', 'varlen')


def model_task(quick: bool) -> task_lib.ReadoutTask:
  """The demo task with `MODEL` (or `QUICK_MODEL`) sizes."""
  size = QUICK_MODEL if quick else MODEL
  config = configs.readout_demo_task(batch_size=size.batch)
  config.model.encoder.override(
      dict(hidden_size=size.hidden_size, num_heads=size.num_heads,
           num_layers=size.num_layers,
           intermediate_size=size.intermediate_size), is_strict=True)
  return task_lib.ReadoutTask(config)


def demo_batches(task: task_lib.ReadoutTask, num_trials: int
                 ) -> Dict[str, Dict[str, tf.Tensor]]:
  """{'padded': batch, 'varlen': batch} of the first `num_trials` demo
  trials, parsed and batched by the dataloader."""
  config = task.task_config
  records = list(demo_data.generate_trials(
      num_trials, seed=0, split_id=1, input_dim=config.train_data.input_dim))
  parser = dataloader.Parser(config.train_data, config.readouts,
                             config.task_vocabulary)
  parsed = tf.data.Dataset.from_tensor_slices(records).map(parser.parse)
  out = {}
  for batching in BATCHINGS:
    ds = dataloader.batch_examples(
        parsed, config.train_data.replace(batching=batching), num_trials,
        parser.max_target_size)
    out[batching] = next(iter(ds))
  return out


def _signature(batch: Dict[str, tf.Tensor]) -> Dict[str, tf.TensorSpec]:
  """Every dimension unknown but feature widths: one trace for any batch."""
  spec = {}
  for key, value in batch.items():
    shape = [None] * value.shape.rank
    if key in ('input_values', 'output_targets'):
      shape[-1] = value.shape[-1]
    spec[key] = tf.TensorSpec(shape, value.dtype)
  return spec


def step_fn(task: task_lib.ReadoutTask, model, batch, traced: bool = True):
  """Forward and backward as in training, no optimizer update: `step(batch)`
  -> (outputs {task: [rows, dim]}, the total loss (`task.compute_losses`), its
  gradients w.r.t. `model.trainable_variables`); a `tf.function` traced for
  any batch size (`traced`), else eager."""

  def step(inputs):
    with tf.GradientTape() as tape:
      share, _, (outputs, _, _) = task.compute_losses(inputs, model,
                                                      training=True)
    loss = share['total_loss']
    return outputs, loss, tape.gradient(loss, model.trainable_variables)

  if not traced:
    return step
  return tf.function(step, input_signature=[_signature(batch)])


def encoder_step_fn(model, batch, traced: bool = True):
  """The part of `step_fn` both batchings share, the token embedding and the
  encoder: `step(batch)` -> (the sum of the encoded tokens, its gradients
  w.r.t. the embedding's and the encoder's variables)."""
  variables = (model.token_embedding.trainable_variables +
               model.encoder.trainable_variables)

  def step(inputs):
    with tf.GradientTape() as tape:
      tokens = model.token_embedding(inputs['input_values'])
      encoded, _ = model.encoder(tokens, inputs['input_timestamps'],
                                 inputs['input_mask'], training=True)
      total = tf.reduce_sum(encoded)
    return total, tape.gradient(total, variables)

  if not traced:
    return step
  return tf.function(step, input_signature=[_signature(
      {k: batch[k] for k in ('input_values', 'input_timestamps',
                             'input_mask')})])


def first_trials(batch: Dict[str, tf.Tensor], n: int
                 ) -> Dict[str, tf.Tensor]:
  """The sub-batch of the first `n` trials (padded or chained layout): the
  per-trial keys (tokens, unit and session ids) sliced, in the chained
  layout the queries of those trials kept (`output_batch_index` < n)."""
  if 'output_batch_index' not in batch:
    return {k: v[:n] for k, v in batch.items()}
  keep = batch['output_batch_index'] < n
  return {k: v[:n] if k in dataloader.PER_TRIAL_KEYS
          else tf.boolean_mask(v, keep) for k, v in batch.items()}


def _step_memory(task: task_lib.ReadoutTask, model,
                 batch: Dict[str, tf.Tensor]) -> Dict[str, Any]:
  """{'loss', 'step_peak_mb'} of one whole-batch training step, after a warm-up
  step on the first `WARMUP_TRIALS` trials."""
  step = step_fn(task, model, batch)
  timing.block(step(first_trials(batch, WARMUP_TRIALS)))
  results = []

  def whole_batch():
    results.append(step(batch))
    timing.block(results[-1])

  grown = memory_lib.step_peak_mb(whole_batch)
  return {'loss': float(results[0][1]), 'step_peak_mb': grown}


def _child_code(child: str, batching: str, quick: bool) -> str:
  """The `python -c` program that runs `readout.<child>(batching, quick)`
  and prints its result line, 'RESULT {json}'."""
  return ('from official_ext.benchmarks import readout, memory; '
          f'r = readout.{child}({batching!r}, {quick}); '
          'print(memory.result_line(r))')


def memory_child(batching: str, quick: bool) -> Dict[str, Any]:
  """Runs in the child process: the memory one whole-batch step takes."""
  task = model_task(quick)
  model = task.build_model()
  size = QUICK_MODEL if quick else MODEL
  return _step_memory(task, model, demo_batches(task, size.batch)[batching])


def memory_child_code(batching: str, quick: bool) -> str:
  """The `python -c` program of the memory child: prints 'RESULT {json}'."""
  return _child_code('memory_child', batching, quick)


def run_model(quick: bool = False, memory: bool = True) -> Dict[str, Any]:
  """The whole model's training step on demo trials, padded vs varlen, timed
  interleaved with the encoder part both share; `quick`: `QUICK_MODEL`
  sizes, eager steps timed once; `memory`: each variant's peak memory in a
  child process.

  Returns:
    'model_*' figures (docs/benchmarks.md#multitask-readout).

  Raises:
    AssertionError: the two batchings hold different queries, or give
      different outputs, losses or gradients; the encoder part leaves a
      variable without a gradient."""
  task = model_task(quick)
  size = QUICK_MODEL if quick else MODEL
  model = task.build_model()
  batches = demo_batches(task, size.batch)
  padded, varlen = batches['padded'], batches['varlen']
  rows = int(varlen['output_readout_index'].shape[0])
  if rows != int(np.sum(padded['output_readout_index'].numpy() != 0)):
    raise AssertionError('padded and chained batches hold different queries')
  steps = {b: step_fn(task, model, batches[b], traced=not quick)
           for b in BATCHINGS}
  # The same predictions, loss and gradients both ways (and the traces).
  (out_p, loss_p, grad_p), (out_v, loss_v, grad_v) = (
      steps[b](batches[b]) for b in BATCHINGS)
  np.testing.assert_allclose(loss_p, loss_v, rtol=1e-5, err_msg='loss')
  for name in out_p:
    np.testing.assert_allclose(out_p[name], out_v[name], rtol=1e-4,
                               atol=1e-5, err_msg=name)
  for var, a, b in zip(model.trainable_variables, grad_p, grad_v):
    np.testing.assert_allclose(tf.convert_to_tensor(a), tf.convert_to_tensor(b),
                               rtol=1e-4, atol=1e-6, err_msg=var.name)
  encoder_inputs = {k: padded[k] for k in ('input_values',
                                            'input_timestamps', 'input_mask')}
  encoder_step = encoder_step_fn(model, padded, traced=not quick)
  _, encoder_grads = encoder_step(encoder_inputs)  # (The trace.)
  if not encoder_grads or any(g is None for g in encoder_grads):
    raise AssertionError('the encoder part has no gradient for some of the '
                         'embedding and encoder variables')
  candidates = {b: (lambda b=b: steps[b](batches[b])) for b in BATCHINGS}
  candidates['encoder'] = lambda: encoder_step(encoder_inputs)
  seconds = timing.interleaved_seconds(
      candidates, rounds=1 if quick else 3, warmup=0,
      min_seconds=0.0 if quick else 1.0)
  padded_rows = int(np.prod(padded['output_readout_index'].shape))
  out = {
      'model_padded_rows_per_sec': rows / seconds['padded'],
      'model_varlen_rows_per_sec': rows / seconds['varlen'],
      'model_varlen_speedup': seconds['padded'] / seconds['varlen'],
      'model_num_samples': int(size.batch),
      'model_num_queries': rows,
      'model_padded_rows': padded_rows,
      'model_padding_fraction': 1.0 - rows / padded_rows,
      'model_hidden_size': int(size.hidden_size),
      'model_input_tokens': int(padded['input_mask'].shape[1]),
      # What bounds the speed-up: the shared encoder's share of the padded
      # step, and the speed-up if the chained step's query part took no
      # time at all (padded step / encoder).
      'model_encoder_share_of_padded': seconds['encoder'] / seconds['padded'],
      'model_varlen_speedup_bound': seconds['padded'] / seconds['encoder'],
  }
  if memory:
    for batching in BATCHINGS:
      child = memory_lib.run_child(memory_child_code(batching, quick))
      out[f'model_{batching}_step_peak_mb'] = child['step_peak_mb']
  return out


class SpikeSize(NamedTuple):
  """The spike-token case: a batch of windows of one recording's spikes."""
  batch: int  # Windows (samples) per batch.
  units: int  # Units of the recording (the unit vocabulary).
  window_seconds: float
  # The units' mean firing rate; each unit's is log-normal around it (std
  # 0.5 of the log).
  mean_rate_hz: float
  num_latents: int  # The Perceiver encoder's latents.
  hidden_size: int
  num_heads: int
  num_layers: int
  intermediate_size: int
  # `wheel_speed` queries per second of window; plus one `choice` query.
  queries_per_second: int


# 200 units x 1 s windows at ~20 Hz (~4,000 spike tokens a window), batch
# 64, 128 latents, the demo's encoder width.
SPIKES = SpikeSize(batch=64, units=200, window_seconds=1.0, mean_rate_hz=20.0,
                   num_latents=128, hidden_size=64, num_heads=4, num_layers=2,
                   intermediate_size=128, queries_per_second=10)
QUICK_SPIKES = SpikeSize(batch=4, units=8, window_seconds=0.5,
                         mean_rate_hz=10.0, num_latents=4, hidden_size=8,
                         num_heads=2, num_layers=1, intermediate_size=8,
                         queries_per_second=4)
SPIKE_SESSION = 'spike-benchmark'


def spike_task(quick: bool, vocabulary_file: str) -> task_lib.ReadoutTask:
  """The demo's readouts on unit tokens (`SPIKES` or `QUICK_SPIKES`
  sizes), the unit vocabulary read from `vocabulary_file`."""
  size = QUICK_SPIKES if quick else SPIKES
  config = configs.readout_demo_task(batch_size=size.batch)
  config.override({
      'model': {'tokenization': 'unit_tokens', 'encoder': dict(
          hidden_size=size.hidden_size, num_heads=size.num_heads,
          num_layers=size.num_layers, num_latents=size.num_latents,
          intermediate_size=size.intermediate_size)},
      'train_data': {'input_dim': 1}, 'validation_data': {'input_dim': 1},
      'vocabulary_file': vocabulary_file,
      'demo_data': {'enabled': False}}, is_strict=True)
  return task_lib.ReadoutTask(config)


def spike_vocabulary(quick: bool) -> vocabulary_lib.Vocabulary:
  """One session of `units` units: the benchmark's unit vocabulary."""
  size = QUICK_SPIKES if quick else SPIKES
  return vocabulary_lib.extend(
      vocabulary_lib.Vocabulary(), sessions=[SPIKE_SESSION],
      units=[vocabulary_lib.unit_name(SPIKE_SESSION, f'unit{i:04d}')
             for i in range(size.units)])


def spike_records(quick: bool, vocabulary: vocabulary_lib.Vocabulary,
                  seed: int = 0) -> List[bytes]:
  """`batch` serialized windows of Poisson spikes (one token a spike, in time
  order), with `wheel_speed` queries every 1/queries_per_second s and one
  `choice` query; random targets."""
  size = QUICK_SPIKES if quick else SPIKES
  rng = np.random.default_rng(seed)
  rates = size.mean_rate_hz * np.exp(rng.normal(-0.125, 0.5, size.units))
  ids = configs.task_index(configs.DEMO_VOCABULARY)
  unit_ids = np.array([vocabulary.unit_id(u) for u in vocabulary.units])
  n_q = int(round(size.queries_per_second * size.window_seconds))
  records = []
  for i in range(size.batch):
    counts = rng.poisson(rates * size.window_seconds)
    units = np.repeat(unit_ids, counts)
    times = rng.uniform(0, size.window_seconds, units.size)
    order = np.argsort(times, kind='stable')
    query_times = (np.arange(n_q) + 0.5) / size.queries_per_second
    records.append(dataloader.make_example(
        f'window{i:04d}', np.ones([units.size, 1], np.float32),
        times[order], input_unit_ids=units[order],
        output_task_ids=[ids['wheel_speed']] * n_q + [ids['choice']],
        output_timestamps=list(query_times) + [size.window_seconds / 2],
        output_targets=[[v] for v in rng.normal(size=n_q)] +
        [[float(rng.integers(0, 2))]],
        session_id=SPIKE_SESSION).SerializeToString())
  return records


def spike_batches(task: task_lib.ReadoutTask,
                  vocabulary: vocabulary_lib.Vocabulary, quick: bool
                  ) -> Dict[str, Dict[str, tf.Tensor]]:
  """{'padded': batch, 'varlen': batch} of `spike_records`, parsed and
  batched by the dataloader."""
  config = task.task_config
  records = spike_records(quick, vocabulary)
  parser = dataloader.Parser(config.train_data, config.readouts,
                             config.task_vocabulary, units=vocabulary)
  parsed = tf.data.Dataset.from_tensor_slices(records).map(parser.parse)
  return {batching: next(iter(dataloader.batch_examples(
      parsed, config.train_data.replace(batching=batching), len(records),
      parser.max_target_size))) for batching in BATCHINGS}


def _spike_setup(quick: bool, folder: str):
  """(task, model, {batching: batch}) of the spike-token case; the
  vocabulary file is written into `folder`."""
  vocabulary = spike_vocabulary(quick)
  path = os.path.join(folder, 'vocabulary.json')
  vocabulary_lib.save(vocabulary, path)
  task = spike_task(quick, path)
  model = task.build_model()
  return task, model, spike_batches(task, vocabulary, quick)


def spike_memory_child(batching: str, quick: bool) -> Dict[str, Any]:
  """Runs in the child process: the memory one spike-token training step
  (forward, losses, gradients) adds, after a warm-up step."""
  with tempfile.TemporaryDirectory() as folder:
    task, model, batches = _spike_setup(quick, folder)
    return _step_memory(task, model, batches[batching])


def spike_memory_child_code(batching: str, quick: bool) -> str:
  """The `python -c` program of the spike-token memory child."""
  return _child_code('spike_memory_child', batching, quick)


def run_spike_tokens(quick: bool = False, memory: bool = True
                     ) -> Dict[str, Any]:
  """A unit-token model's training step on spike windows (`SPIKES`; every
  spike a token, a Perceiver encoder), queries padded vs chained (input tokens
  padded in both), timed interleaved after their losses and gradients are
  checked equal.

  Returns:
    'spike_*' figures: per batching tokens/s (real spike tokens) and s per
    step, 'spike_varlen_speedup', the sizes, real and padded token counts,
    'spike_num_queries' and, with `memory`, 'spike_<batching>_step_peak_mb'
    (each in a fresh child process)."""
  size = QUICK_SPIKES if quick else SPIKES
  with tempfile.TemporaryDirectory() as folder:
    task, model, batches = _spike_setup(quick, folder)
  steps = {b: step_fn(task, model, batches[b], traced=not quick)
           for b in BATCHINGS}
  (_, loss_p, grad_p), (_, loss_v, grad_v) = (
      steps[b](batches[b]) for b in BATCHINGS)
  np.testing.assert_allclose(loss_p, loss_v, rtol=1e-5, err_msg='loss')
  for var, a, b in zip(model.trainable_variables, grad_p, grad_v):
    np.testing.assert_allclose(tf.convert_to_tensor(a),
                               tf.convert_to_tensor(b), rtol=1e-4, atol=1e-6,
                               err_msg=var.name)
  seconds = timing.interleaved_seconds(
      {b: (lambda b=b: steps[b](batches[b])) for b in BATCHINGS},
      rounds=1 if quick else 3, warmup=0, min_seconds=0.0 if quick else 2.0)
  mask = batches['padded']['input_mask'].numpy()
  tokens = int(mask.sum())
  out = {
      'spike_num_samples': int(size.batch),
      'spike_units': int(size.units),
      'spike_window_seconds': float(size.window_seconds),
      'spike_mean_rate_hz': float(size.mean_rate_hz),
      'spike_num_latents': int(size.num_latents),
      'spike_hidden_size': int(size.hidden_size),
      'spike_tokens': tokens,
      'spike_padded_tokens': int(mask.size),
      'spike_token_padding_fraction': 1.0 - tokens / float(mask.size),
      'spike_num_queries': int(
          batches['varlen']['output_readout_index'].shape[0]),
      'spike_varlen_speedup': seconds['padded'] / seconds['varlen'],
  }
  for batching in BATCHINGS:
    out[f'spike_{batching}_tokens_per_sec'] = tokens / seconds[batching]
    out[f'spike_{batching}_sec_per_step'] = seconds[batching]
  if memory:
    for batching in BATCHINGS:
      child = memory_lib.run_child(spike_memory_child_code(batching, quick))
      out[f'spike_{batching}_step_peak_mb'] = child['step_peak_mb']
  return out


# `run`'s cases (`--cases`): the readout layer and the whole demo model
# ('model'), a training step on spike tokens ('spike_tokens').
CASES = ('model', 'spike_tokens')
DEFAULT_CASES = CASES  # A run without --cases.


def run(quick: bool = False, memory: bool = True,
        cases: Optional[Sequence[str]] = None,
        step_figures: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
  """Case 'model' (`run_heads` and `run_model`) and case 'spike_tokens'
  (`run_spike_tokens`).

  Args:
    quick: tiny sizes.
    memory: also run the memory children.
    cases: which of `CASES` to measure (default all; CLI `--cases`).
    step_figures: unused (the harness passes the recorded figures).

  Raises:
    ValueError: a case not in `CASES`, naming it."""
  del step_figures  # The cases measure independently.
  cases = list(cases or DEFAULT_CASES)
  unknown = [c for c in cases if c not in CASES]
  if unknown:
    raise ValueError(f'--cases: unknown readout case(s) {unknown}; the '
                     f'cases are {list(CASES)}.')
  out = {}
  if 'model' in cases:
    out.update(run_heads(quick), **run_model(quick, memory=memory))
  if 'spike_tokens' in cases:
    out.update(run_spike_tokens(quick, memory=memory))
  return out
