"""Readout records: schema, writer and the `tf.data` input pipeline.

The record schema, its checks and the batch layout: docs/readout.md#data.
"""
import functools
import json
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official_ext.core.input import bad_records as bad_records_lib
from official_ext.core.input import eval_padding
from official_ext.core.input import graph_checks
from official_ext.core.input import input_files
from official_ext.core.input import tfrecord_input
from official_ext.readout import configs
from official_ext.readout import readout_types
from official_ext.readout import unit_vocabulary as vocabulary_lib


# ---------------------------------------------------------------------------
# Writer.
# ---------------------------------------------------------------------------


def make_example(example_id: str,
                 input_values: np.ndarray,
                 input_timestamps: Sequence[float],
                 output_task_ids: Sequence[int],
                 output_timestamps: Sequence[float],
                 output_targets: Sequence[Sequence[float]],
                 output_weights: Optional[Sequence[float]] = None,
                 session_id: Optional[str] = None,
                 window_start: Optional[float] = None,
                 output_eval_mask: Optional[Sequence[int]] = None,
                 input_unit_ids: Optional[Sequence[int]] = None
                 ) -> tf.train.Example:
  """One readout record, a `tf.train.Example` (docs/readout.md#data).

  Args:
    example_id: the record's name.
    input_values: float [n_in, input_dim]; input_timestamps: float [n_in].
    output_task_ids, output_timestamps: [n_q] routing ids and times.
    output_targets: n_q sequences of floats.
    output_weights: float [n_q]; None: all 1.
    session_id, window_start, output_eval_mask: None: not stored.
    input_unit_ids: int [n_in] vocabulary ids of unit tokens; None: binned.

  Raises:
    ValueError: naming the argument whose shape or length disagrees.
  """
  values = np.asarray(input_values, np.float32)
  if values.ndim != 2:
    raise ValueError(f'make_example({example_id!r}): input_values must be '
                     f'[n_in, input_dim]; got shape {values.shape}.')
  times = np.asarray(input_timestamps, np.float32).reshape([-1])
  if times.shape[0] != values.shape[0]:
    raise ValueError(f'make_example({example_id!r}): {times.shape[0]} '
                     f'input_timestamps for {values.shape[0]} input tokens.')
  if input_unit_ids is not None:
    unit_ids = np.asarray(input_unit_ids, np.int64).reshape([-1])
    if unit_ids.shape[0] != values.shape[0] or values.shape[1] != 1:
      raise ValueError(f'make_example({example_id!r}): {unit_ids.shape[0]} '
                       f'input_unit_ids for input_values of shape '
                       f'{values.shape}; unit tokens are [n_in, 1] with one '
                       'unit id each.')
    if session_id is None:
      raise ValueError(f'make_example({example_id!r}): unit tokens '
                       '(input_unit_ids) need a session_id.')
  n_q = len(output_task_ids)
  weights = np.ones([n_q]) if output_weights is None else output_weights
  for key, seq in (('output_timestamps', output_timestamps),
                   ('output_targets', output_targets),
                   ('output_weights', weights)) + (
                       (('output_eval_mask', output_eval_mask),)
                       if output_eval_mask is not None else ()):
    if len(seq) != n_q:
      raise ValueError(f'make_example({example_id!r}): {len(seq)} {key} for '
                       f'{n_q} output_task_ids.')
  targets = [np.asarray(t, np.float32).reshape([-1]) for t in output_targets]
  feature = {
      'example_id': tf.train.Feature(bytes_list=tf.train.BytesList(
          value=[example_id.encode('utf-8')])),
      'input_values': _floats(values.reshape([-1])),
      'input_timestamps': _floats(times),
      'output_task_ids': tf.train.Feature(int64_list=tf.train.Int64List(
          value=[int(i) for i in output_task_ids])),
      'output_timestamps': _floats(output_timestamps),
      'output_weights': _floats(weights),
      'output_target_sizes': tf.train.Feature(int64_list=tf.train.Int64List(
          value=[t.size for t in targets])),
      'output_targets': _floats(np.concatenate(targets) if targets else []),
  }
  if session_id is not None:
    feature['session_id'] = tf.train.Feature(bytes_list=tf.train.BytesList(
        value=[session_id.encode('utf-8')]))
  if window_start is not None:
    feature['window_start'] = _floats([window_start])
  if input_unit_ids is not None:
    feature['input_unit_ids'] = tf.train.Feature(
        int64_list=tf.train.Int64List(value=unit_ids.tolist()))
  if output_eval_mask is not None:
    feature['output_eval_mask'] = tf.train.Feature(
        int64_list=tf.train.Int64List(value=[int(m) for m in
                                             output_eval_mask]))
  return tf.train.Example(features=tf.train.Features(feature=feature))


def _floats(values) -> tf.train.Feature:
  return tf.train.Feature(float_list=tf.train.FloatList(
      value=np.asarray(values, np.float32).reshape([-1]).tolist()))


def session_counts(input_path) -> Dict[str, int]:
  """{`session_id`: its records} ('' without one) over `input_path`'s files."""
  files = input_files.match_input_files(input_path)
  feature = {'session_id': tf.io.FixedLenFeature([], tf.string,
                                                 default_value='')}
  ds = tf.data.TFRecordDataset(files).batch(4096).map(
      lambda records: tf.io.parse_example(records, feature)['session_id'])
  counts: Dict[str, int] = {}
  for batch in ds.as_numpy_iterator():
    for name in batch.tolist():
      name = name.decode('utf-8')
      counts[name] = counts.get(name, 0) + 1
  return counts


def session_names(input_path) -> List[str]:
  """The distinct non-empty `session_id`s of `input_path`'s records, sorted."""
  return sorted(n for n in session_counts(input_path) if n)


def write_records(path: str, examples) -> int:
  """Writes Examples (or bytes) to a TFRecord file; returns how many."""
  count = 0
  with tf.io.TFRecordWriter(path) as writer:
    for example in examples:
      writer.write(example if isinstance(example, bytes) else
                   example.SerializeToString())
      count += 1
  return count


# ---------------------------------------------------------------------------
# Checks.
# ---------------------------------------------------------------------------


def _check_config(params: configs.DataConfig) -> None:
  if int(params.input_dim) < 1:
    raise ValueError(f'DataConfig.input_dim is {params.input_dim}; expected '
                     'a positive int.')
  if params.batching not in ('padded', 'varlen'):
    raise ValueError(f"DataConfig.batching is {params.batching!r}; expected "
                     "'padded' or 'varlen'.")
  if int(params.pad_multiple) < 1:
    raise ValueError(f'DataConfig.pad_multiple is {params.pad_multiple}; '
                     'expected >= 1.')
  for key in ('max_input_tokens', 'max_queries'):
    value = getattr(params, key)
    if value is not None and int(value) < 1:
      raise ValueError(f'DataConfig.{key} is {value}; expected None or >= 1.')
  if params.max_queries is not None and params.batching == 'varlen':
    raise ValueError('DataConfig.max_queries applies to padded batching; '
                     "batching is 'varlen'.")


# ---------------------------------------------------------------------------
# Decoding and parsing.
# ---------------------------------------------------------------------------


class Parser:
  """Serialized record -> validated example dict (one sample)."""

  def __init__(self, params: configs.DataConfig,
               readouts: Sequence[configs.ReadoutSpec],
               task_vocabulary: Sequence[str],
               session_names: Optional[Sequence[str]] = None,
               units: Optional[vocabulary_lib.Vocabulary] = None,
               unweighted_metrics: bool = False):
    """Args:
      params: the split's DataConfig.
      readouts: the task's ReadoutSpecs.
      task_vocabulary: task names; id = 1 + position.
      session_names: the records' sessions (`session_names()`); given, the
        examples carry `session_index` (-1 without a session_id) and
        `window_start`. None: sessions are not read.
      units: the unit vocabulary of unit tokens (examples carry
        `input_unit_ids` and `session_ids`); None: binned tokens.
      unweighted_metrics: a query of a record without `output_eval_mask`
        has metric weight 1, not its loss weight ('torch_brain')."""
    _check_config(params)
    if units is not None and int(params.input_dim) != 1:
      raise ValueError(f'DataConfig.input_dim is {params.input_dim}; unit '
                       'tokens (model.tokenization unit_tokens) carry one '
                       'value each: set it to 1.')
    self._units = units
    configs.validate_readouts(readouts, task_vocabulary)
    self._params = params
    self._unweighted_metrics = bool(unweighted_metrics)
    self._input_dim = int(params.input_dim)
    specs = {s.name: s for s in readouts}
    vocab = list(task_vocabulary)
    size = len(vocab) + 1
    has_spec = np.zeros([size], bool)
    names = ['<padding>'] + vocab
    target_sizes = np.zeros([size], np.int64)
    # The readout types of these specs; a task's type code is the position
    # of its type here.
    self._readout_types = readout_types.types_of(readouts)
    codes = {t.name: i for i, t in enumerate(self._readout_types)}
    types = np.full([size], -1, np.int32)
    dims = np.zeros([size], np.int64)
    target_docs = [''] * size
    for i, name in enumerate(vocab, start=1):
      if name in specs:
        has_spec[i] = True
        target_sizes[i] = readout_types.target_size(specs[name])
        types[i] = codes[specs[name].type]
        dims[i] = specs[name].dim
        target_docs[i] = (f'{specs[name].type}: '
                          f'{self._readout_types[types[i]].target_doc}')
    self._has_spec = has_spec
    self._names = names
    self._target_sizes = target_sizes
    self._types = types
    self._dims = dims
    self._target_docs = target_docs
    self._spec_names = [s.name for s in readouts]
    self.max_target_size = int(target_sizes.max())
    self._features = {
        'example_id': tf.io.FixedLenFeature([], tf.string, default_value=''),
        'input_values': tf.io.RaggedFeature(tf.float32),
        'input_timestamps': tf.io.RaggedFeature(tf.float32),
        'output_task_ids': tf.io.RaggedFeature(tf.int64),
        'output_timestamps': tf.io.RaggedFeature(tf.float32),
        'output_weights': tf.io.RaggedFeature(tf.float32),
        'output_target_sizes': tf.io.RaggedFeature(tf.int64),
        'output_targets': tf.io.RaggedFeature(tf.float32),
        'output_eval_mask': tf.io.RaggedFeature(tf.int64),
    }
    self._session_names = (None if session_names is None else
                           [str(n) for n in session_names])
    if self._session_names is not None:
      if '' in self._session_names:
        raise ValueError('Parser: session_names holds an empty name; an '
                         'empty session_id means "no session".')
      self._features['session_id'] = tf.io.FixedLenFeature(
          [], tf.string, default_value='')
      self._features['window_start'] = tf.io.FixedLenFeature(
          [], tf.float32, default_value=0.0)
    if units is not None:
      self._features['session_id'] = tf.io.FixedLenFeature(
          [], tf.string, default_value='')
      self._features['input_unit_ids'] = tf.io.RaggedFeature(tf.int64)
      # The session id of each unit id (row 0: padding, session 0).
      session_of = np.zeros([units.num_unit_ids], np.int64)
      for i, name in enumerate(units.units, start=1):
        session_of[i] = units.session_id(vocabulary_lib.session_of_unit(name))
      self._session_of_unit = session_of

  def parse(self, serialized: tf.Tensor,
            source: Optional[tf.Tensor] = None) -> Dict[str, tf.Tensor]:
    """Parses and validates one record (`source`: its file, for errors)."""
    if source is None:
      source = tf.constant('<unknown file>')
    # A tf.train.Example is a SequenceExample's context on the wire; this
    # parser names the file in its errors (a record that is not a proto, a
    # feature of another dtype), which parse_single_example does not.
    f, _ = tf.io.parse_single_sequence_example(
        serialized, context_features=self._features, example_name=source)
    rid = f['example_id']

    def where(parts_fn):
      # Message parts are built lazily: only when the check fails.
      return lambda: graph_checks.join('Record `', rid, '` in file `', source,
                                       '`: ', *parts_fn())

    checks = self._check_lengths(f, where)
    with tf.control_dependencies(checks):
      ids = tf.identity(f['output_task_ids'])
    safe, name, check_ids = self._check_task_ids(ids, where)
    with tf.control_dependencies([check_ids]):
      expected = tf.gather(self._target_sizes, safe)
    targets, target_checks = self._targets_by_query(
        f['output_targets'], f['output_target_sizes'], expected, name,
        tf.gather(self._target_docs, safe), where)
    value_checks = self._check_target_values(
        f['output_targets'], targets.value_rowids(), safe, name, rid, source)
    value_checks.append(self._check_weights(f['output_weights'], name, where))
    metric_weights, mask_checks = self._metric_weights(f, where)
    sample = {}
    if self._session_names is not None:
      sample, session_checks = self._session(f, where)
      mask_checks += session_checks
    if self._units is not None:
      unit_sample, unit_checks = self._unit_tokens(f, where)
      sample.update(unit_sample)
      mask_checks += unit_checks
    # Every output waits for every check.
    with tf.control_dependencies(checks + value_checks + [check_ids] +
                                 target_checks + mask_checks):
      return {
          **{k: tf.identity(v) for k, v in sample.items()},
          'output_metric_weights': tf.identity(metric_weights),
          'input_values': tf.reshape(f['input_values'],
                                     [-1, self._input_dim]),
          'input_timestamps': tf.identity(f['input_timestamps']),
          'input_mask': tf.ones([tf.size(f['input_timestamps'])], tf.bool),
          'output_readout_index': tf.cast(ids, tf.int32),
          'output_timestamps': tf.identity(f['output_timestamps']),
          'output_weights': tf.identity(f['output_weights']),
          'output_targets': targets.to_tensor(
              default_value=0.0, shape=[None, self.max_target_size]),
      }

  def _metric_weights(self, f: Dict[str, tf.Tensor],
                      where: Callable[..., Callable[[], tf.Tensor]]
                      ) -> Tuple[tf.Tensor, List[tf.Tensor]]:
    """(float32 [n_q] metric weights, the checks): `output_eval_mask`, else
    the loss weights (1 with `unweighted_metrics`)."""
    mask, weights = f['output_eval_mask'], f['output_weights']
    n_q = tf.size(f['output_task_ids'])
    has_mask = tf.size(mask) > 0
    bad = tf.logical_and(tf.not_equal(mask, 0), tf.not_equal(mask, 1))
    checks = [
        graph_checks.require(
            tf.logical_or(tf.logical_not(has_mask),
                          tf.equal(tf.size(mask), n_q)),
            where(lambda: ('output_eval_mask has ', tf.size(mask),
                           ' entries for ', n_q,
                           ' output_task_ids; expected one per query.'))),
        graph_checks.require(
            tf.logical_not(tf.reduce_any(bad)), where(lambda: (
                'query ', graph_checks.first_where(tf.range(tf.size(mask)),
                                                   bad),
                ' has output_eval_mask ', graph_checks.first_where(mask, bad),
                '; expected 0 or 1.'))),
    ]
    fallback = (tf.ones_like(weights) if self._unweighted_metrics else
                weights)
    with tf.control_dependencies(checks):
      return tf.cond(has_mask, lambda: tf.cast(mask, tf.float32),
                     lambda: tf.identity(fallback)), checks

  def _unit_tokens(self, f: Dict[str, tf.Tensor],
                   where: Callable[..., Callable[[], tf.Tensor]]
                   ) -> Tuple[Dict[str, tf.Tensor], List[tf.Tensor]]:
    """(`input_unit_ids` int32 [n_in], `session_ids` int32, the checks)."""
    units = self._units
    sid, ids = f['session_id'], f['input_unit_ids']
    names = tf.constant(list(units.sessions) + [''])
    match = tf.equal(names, sid)
    session = tf.cast(tf.argmax(tf.cast(match, tf.int32)), tf.int64) + 1
    known_session = tf.logical_and(tf.reduce_any(match),
                                   tf.not_equal(sid, ''))
    token = tf.range(tf.size(ids))
    known = tf.logical_and(ids >= 1, ids < units.num_unit_ids)
    owner = tf.gather(self._session_of_unit, tf.where(known, ids, 0))
    unknown = tf.logical_not(known)
    foreign = tf.logical_and(known, tf.not_equal(owner, session))
    unit_names = tf.constant(['<padding>'] + list(units.units))
    session_names = tf.constant(['<padding>'] + list(units.sessions))
    checks = [
        graph_checks.require(
            tf.equal(tf.size(ids), tf.size(f['input_timestamps'])),
            where(lambda: ('input_unit_ids has ', tf.size(ids),
                           ' entries for ', tf.size(f['input_timestamps']),
                           ' input tokens; unit tokens need one unit id '
                           'per token.'))),
        graph_checks.require(known_session, where(lambda: (
            'session_id `', sid, '` is not in the unit vocabulary (',
            str(len(units.sessions)), ' sessions: task.vocabulary_file); '
            'unit tokens need a known session_id.'))),
        graph_checks.require(
            tf.logical_not(tf.reduce_any(unknown)), where(lambda: (
                'input token ', graph_checks.first_where(token, unknown),
                ' has unit id ', graph_checks.first_where(ids, unknown),
                ', which is not in the unit vocabulary (ids 1..',
                str(len(units.units)), ': task.vocabulary_file).'))),
        graph_checks.require(
            tf.logical_not(tf.reduce_any(foreign)), where(lambda: (
                'input token ', graph_checks.first_where(token, foreign),
                ' has unit id ', graph_checks.first_where(ids, foreign),
                ' (`', tf.gather(unit_names, graph_checks.first_where(
                    tf.where(known, ids, 0), foreign)),
                '`), a unit of session `', tf.gather(
                    session_names, graph_checks.first_where(owner, foreign)),
                '`, in a record of session `', sid, '`.'))),
    ]
    return {'input_unit_ids': tf.cast(ids, tf.int32),
            'session_ids': tf.cast(session, tf.int32)}, checks

  def _session(self, f: Dict[str, tf.Tensor],
               where: Callable[..., Callable[[], tf.Tensor]]
               ) -> Tuple[Dict[str, tf.Tensor], List[tf.Tensor]]:
    """(`session_index` int32, `window_start` float32, the checks)."""
    sid, start = f['session_id'], f['window_start']
    names = tf.constant(self._session_names + [''])  # Never empty.
    match = tf.equal(names, sid)
    index = tf.cast(tf.argmax(tf.cast(match, tf.int32)), tf.int32)
    checks = [
        graph_checks.require(tf.reduce_any(match), where(lambda: (
            'session_id `', sid, '` is not among the ',
            str(len(self._session_names)),
            ' sessions read from the evaluation files.'))),
        graph_checks.require(tf.math.is_finite(start), where(lambda: (
            'window_start is ', start, '; expected a finite time.'))),
    ]
    return {'session_index': tf.where(tf.equal(sid, ''), -1, index),
            'window_start': start}, checks

  def _check_lengths(self, f: Dict[str, tf.Tensor],
                     where: Callable[..., Callable[[], tf.Tensor]]
                     ) -> List[tf.Tensor]:
    """Checks list lengths, finite values and times, token / query limits."""
    values, times = f['input_values'], f['input_timestamps']
    ids, q_times = f['output_task_ids'], f['output_timestamps']
    n_in, n_q = tf.size(times), tf.size(ids)
    checks = [
        graph_checks.require(n_in > 0, where(lambda: (
            'has no input tokens (input_timestamps is empty); expected at '
            'least one.',))),
        graph_checks.require(
            tf.equal(tf.size(values), n_in * self._input_dim),
            where(lambda: (
                'input_values has ', tf.size(values), ' values for ', n_in,
                ' input tokens; expected n_in * input_dim = ', n_in,
                f' * {self._input_dim} (DataConfig.input_dim).'))),
    ]
    for key in ('output_timestamps', 'output_weights', 'output_target_sizes'):
      t = f[key]
      checks.append(graph_checks.require(
          tf.equal(tf.size(t), n_q), where(lambda key=key, t=t: (
              key, ' has ', tf.size(t), ' entries for ', n_q,
              ' output_task_ids; expected one per query.'))))
    for key in ('input_values', 'input_timestamps', 'output_timestamps'):
      checks.append(graph_checks.require(
          tf.reduce_all(tf.math.is_finite(f[key])), where(lambda key=key: (
              key, ' has a NaN or infinite value.'))))
    max_input_tokens = self._params.max_input_tokens
    if max_input_tokens is not None:
      checks.append(graph_checks.require(
          n_in <= max_input_tokens, where(lambda: (
              'has ', n_in, ' input tokens; DataConfig.max_input_tokens is ',
              str(max_input_tokens), '.'))))
    max_queries = self._params.max_queries
    if max_queries is not None:
      checks.append(graph_checks.require(n_q <= max_queries, where(lambda: (
          'has ', n_q, ' queries; DataConfig.max_queries is ',
          str(max_queries), '.'))))
    return checks

  def _check_task_ids(self, ids: tf.Tensor,
                      where: Callable[..., Callable[[], tf.Tensor]]
                      ) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """(ids with unknown ones as 0, task names [n_q], the check)."""
    qpos = tf.range(tf.size(ids))
    known = tf.logical_and(ids >= 0, ids < len(self._names))
    safe = tf.where(known, ids, 0)
    bad = tf.logical_not(
        tf.logical_and(known, tf.gather(self._has_spec, safe)))
    name = tf.gather(tf.constant(self._names), safe)
    first = lambda values: graph_checks.first_where(values, bad)
    check = graph_checks.require(
        tf.logical_not(tf.reduce_any(bad)), where(lambda: (
            'query ', first(qpos), ' has task id ', first(ids), ' (',
            tf.where(first(known), first(name),
                     '<not in task.task_vocabulary>'),
            '), which has no ReadoutSpec; readouts are '
            f'{self._spec_names} with ids '
            f'{[self._names.index(n) for n in self._spec_names]} '
            '(id 0 is padding, never a query).')))
    return safe, name, check

  def _targets_by_query(self, targets: tf.Tensor, sizes: tf.Tensor,
                        expected: tf.Tensor, name: tf.Tensor,
                        target_doc: tf.Tensor,
                        where: Callable[..., Callable[[], tf.Tensor]]
                        ) -> Tuple[tf.RaggedTensor, List[tf.Tensor]]:
    """(float32 [n_q, None] ragged targets, the checks of their sizes)."""
    qpos = tf.range(tf.size(sizes))
    bad = tf.not_equal(sizes, expected)
    first = lambda values: graph_checks.first_where(values, bad)
    check_sizes = graph_checks.require(
        tf.logical_not(tf.reduce_any(bad)), where(lambda: (
            'query ', first(qpos), ' of task `', first(name),
            '` has a target of ', first(sizes), ' values; expected ',
            first(expected), ' (', first(target_doc), ').')))
    check_total = graph_checks.require(
        tf.equal(tf.reduce_sum(sizes), tf.cast(tf.size(targets), tf.int64)),
        where(lambda: (
            'output_targets has ', tf.size(targets),
            ' values but output_target_sizes add up to ', tf.reduce_sum(sizes),
            '.')))
    checks = [check_sizes, check_total]
    with tf.control_dependencies(checks):
      return tf.RaggedTensor.from_row_lengths(targets, sizes), checks

  def _check_target_values(self, values: tf.Tensor,
                           query_of_value: tf.Tensor, safe: tf.Tensor,
                           name: tf.Tensor, rid: tf.Tensor,
                           source: tf.Tensor) -> List[tf.Tensor]:
    """The checks of each target value against its readout type."""
    vname = tf.gather(name, query_of_value)
    vtype = tf.gather(tf.gather(self._types, safe), query_of_value)
    vdim = tf.cast(tf.gather(tf.gather(self._dims, safe), query_of_value),
                   tf.float32)
    vq = tf.cast(query_of_value, tf.int32)
    refused = [(tf.logical_not(tf.math.is_finite(values)),
                'a NaN or infinite target value')]
    for code, readout_type in enumerate(self._readout_types):
      for what, invalid in readout_type.invalid_targets:
        refused.append((tf.logical_and(tf.equal(vtype, code),
                                       invalid(values, vdim)), what))
    checks = []
    for bad, what in refused:
      checks.append(graph_checks.require(
          tf.logical_not(tf.reduce_any(bad)),
          lambda bad=bad, what=what: graph_checks.join(
              'Record `', rid, '` in file `', source, '`: query ',
              graph_checks.first_where(vq, bad), ' of task `',
              graph_checks.first_where(vname, bad), '` has ', what, ': ',
              graph_checks.first_where(values, bad), '.')))
    return checks

  def _check_weights(self, weights: tf.Tensor, name: tf.Tensor,
                     where: Callable[..., Callable[[], tf.Tensor]]
                     ) -> tf.Tensor:
    """Checks that query weights (float32 [n_q]) are finite and >= 0."""
    bad = tf.logical_not(tf.logical_and(tf.math.is_finite(weights),
                                        weights >= 0))
    first = lambda values: graph_checks.first_where(values, bad)
    return graph_checks.require(
        tf.logical_not(tf.reduce_any(bad)), where(lambda: (
            'query ', first(tf.range(tf.size(name))), ' of task `',
            first(name), '` has weight ', first(weights),
            '; expected a finite weight >= 0.')))


# ---------------------------------------------------------------------------
# Batching.
# ---------------------------------------------------------------------------

_INPUT_KEYS = ('input_values', 'input_timestamps', 'input_mask',
               'input_unit_ids')
_QUERY_KEYS = ('output_readout_index', 'output_timestamps', 'output_weights',
               'output_metric_weights', 'output_targets')
# Per-sample keys of stitched evaluation ([B]).
_SAMPLE_KEYS = ('session_index', 'window_start', 'session_ids')
# The keys with one row per trial in both batchings ([B, ...]); in the
# chained batching the query keys are [Q] instead.
PER_TRIAL_KEYS = _INPUT_KEYS + _SAMPLE_KEYS


def _round_up(n: tf.Tensor, multiple: int) -> tf.Tensor:
  return (n + multiple - 1) // multiple * multiple


def _pad_axis1(x: tf.Tensor, length: tf.Tensor) -> tf.Tensor:
  pad = length - tf.shape(x)[1]
  paddings = [[0, 0], [0, pad]] + [[0, 0]] * (x.shape.rank - 2)
  return tf.pad(x, paddings)


def _mask_padding_trials(batch: Dict[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
  """Zeroes the query and metric weights of padding trials."""
  if eval_padding.MASK_KEY not in batch:
    return batch
  mask = tf.cast(batch[eval_padding.MASK_KEY], tf.float32)  # [B]
  if 'output_batch_index' in batch:  # Chained queries [N].
    mask = tf.gather(mask, batch['output_batch_index'])
  else:  # Padded queries [B, n_out].
    mask = mask[:, tf.newaxis]
  batch = dict(batch)
  for key in ('output_weights', 'output_metric_weights'):
    batch[key] = batch[key] * mask
  return batch


def batch_examples(ds: tf.data.Dataset, params: configs.DataConfig,
                   batch_size, max_target_size: int) -> tf.data.Dataset:
  """Batches parsed examples; `batch_size`: an int or an int64 scalar."""
  multiple = int(params.pad_multiple)

  def pad_inputs(batch):
    n = tf.shape(batch['input_timestamps'])[1]
    length = (tf.constant(params.max_input_tokens) if params.max_input_tokens
              else _round_up(n, multiple))
    keys = [k for k in _INPUT_KEYS if k in batch]
    for k in keys:
      batch[k] = _pad_axis1(batch[k], length)
    if params.max_input_tokens:
      batch['input_values'] = tf.ensure_shape(
          batch['input_values'],
          [None, params.max_input_tokens, params.input_dim])
      for k in keys[1:]:
        batch[k] = tf.ensure_shape(batch[k], [None, params.max_input_tokens])
    return batch

  if params.batching == 'padded':
    ds = ds.padded_batch(batch_size, drop_remainder=params.drop_remainder)

    def finish(batch):
      batch = pad_inputs(dict(batch))
      n = tf.shape(batch['output_readout_index'])[1]
      length = (tf.constant(params.max_queries) if params.max_queries else
                _round_up(n, multiple))
      for k in _QUERY_KEYS:
        batch[k] = _pad_axis1(batch[k], length)
      if params.max_queries:
        for k in _QUERY_KEYS:
          shape = [None, params.max_queries] + (
              [max_target_size] if k == 'output_targets' else [])
          batch[k] = tf.ensure_shape(batch[k], shape)
      return _mask_padding_trials(batch)

    return ds.map(finish, num_parallel_calls=tf.data.AUTOTUNE)

  ds = ds.ragged_batch(batch_size, drop_remainder=params.drop_remainder)

  def finish_varlen(batch):
    out = {k: batch[k].to_tensor() for k in _INPUT_KEYS if k in batch}
    out = pad_inputs(out)
    index = batch['output_readout_index']
    for k in _QUERY_KEYS:
      out[k] = batch[k].flat_values if k != 'output_targets' else tf.reshape(
          batch[k].flat_values, [-1, max_target_size])
    out['output_batch_index'] = tf.cast(index.value_rowids(), tf.int32)
    for k in _SAMPLE_KEYS:
      if k in batch:
        out[k] = batch[k]
    if eval_padding.MASK_KEY in batch:
      out[eval_padding.MASK_KEY] = batch[eval_padding.MASK_KEY]
    return _mask_padding_trials(out)

  return ds.map(finish_varlen, num_parallel_calls=tf.data.AUTOTUNE)


def balance_sessions(ds: tf.data.Dataset, counts: Dict[str, int],
                     units: vocabulary_lib.Vocabulary,
                     seed: Optional[int] = None,
                     input_path: str = '') -> tf.data.Dataset:
  """Examples rejection-resampled so every session is drawn equally often.

  `counts`: {session: records} of the files (`session_counts`); a session
  not in `units` is a ValueError naming it.
  """
  present = sorted(n for n in counts if n)
  unknown = [n for n in present if n not in units.sessions]
  if unknown or '' in counts:
    raise ValueError(f'DataConfig.balance_sessions: the records of '
                     f'{input_path} have session_ids {unknown or [""]} not '
                     'in the unit vocabulary (task.vocabulary_file).')
  # Vocabulary id -> the session's class among those present.
  classes = np.zeros([units.num_session_ids], np.int32)
  for k, name in enumerate(present):
    classes[units.session_id(name)] = k
  total = float(sum(counts[n] for n in present))
  initial = [counts[n] / total for n in present]
  target = [1.0 / len(present)] * len(present)
  class_of = tf.constant(classes)
  ds = ds.rejection_resample(
      lambda example: tf.gather(class_of, example['session_ids']),
      target_dist=target, initial_dist=initial, seed=seed)
  return ds.map(lambda unused_class, example: example)


# Parser configuration (JSON) -> its `parse` as a tf.function.
_TRACED_PARSES: Dict[str, Callable[..., Dict[str, tf.Tensor]]] = {}


def traced_parse(params: configs.DataConfig,
                 readouts: Sequence[configs.ReadoutSpec],
                 task_vocabulary: Sequence[str],
                 session_names: Optional[Sequence[str]] = None,
                 units: Optional[vocabulary_lib.Vocabulary] = None,
                 unweighted_metrics: bool = False
                 ) -> Callable[..., Dict[str, tf.Tensor]]:
  """`Parser(...).parse` as one tf.function per parser configuration.

  Pipelines configured alike (training and evaluation, restarts) share one
  trace instead of tracing the parser's checks again.
  """
  key = json.dumps(
      [int(params.input_dim), params.max_input_tokens, params.max_queries,
       [r.as_dict() for r in readouts], [str(n) for n in task_vocabulary],
       None if session_names is None else [str(n) for n in session_names],
       None if units is None else units.as_dict(), bool(unweighted_metrics)],
      sort_keys=True, default=repr)
  if key not in _TRACED_PARSES:
    _TRACED_PARSES[key] = tf.function(Parser(
        params, readouts, task_vocabulary, session_names=session_names,
        units=units, unweighted_metrics=unweighted_metrics).parse)
  return _TRACED_PARSES[key]


def build_dataset(params: configs.DataConfig,
                  readouts: Sequence[configs.ReadoutSpec],
                  task_vocabulary: Sequence[str],
                  input_context: Optional[tf.distribute.InputContext] = None,
                  bad_records: Optional[bad_records_lib.BadRecordLog] = None,
                  session_names: Optional[Sequence[str]] = None,
                  units: Optional[vocabulary_lib.Vocabulary] = None,
                  unweighted_metrics: bool = False
                  ) -> tf.data.Dataset:
  """The batched dataset of one split (docs/readout.md#data).

  `session_names`, `units`, `unweighted_metrics`: as `Parser`'s; training
  with `params.balance_sessions` resamples the sessions.
  """
  _check_config(params)
  parser = Parser(params, readouts, task_vocabulary,
                  session_names=session_names, units=units,
                  unweighted_metrics=unweighted_metrics)
  parse = traced_parse(params, readouts, task_vocabulary, session_names,
                       units, unweighted_metrics)
  transform_fn = None
  if params.balance_sessions and params.is_training:
    if units is None:
      raise ValueError('DataConfig.balance_sessions is True but the tokens '
                       'are binned; balancing reads the records\' '
                       'session_id in the unit vocabulary (model.'
                       'tokenization unit_tokens).')
    transform_fn = functools.partial(
        balance_sessions, counts=session_counts(params.input_path),
        units=units, seed=params.seed, input_path=params.input_path)
  stages = tfrecord_input.Stages(
      decoder_fn=lambda filename, record: parse(record, source=filename),
      transform_fn=transform_fn,
      batch_fn=lambda ds, batch_size: batch_examples(
          ds, params, batch_size, parser.max_target_size))
  return tfrecord_input.build_dataset(params, input_context, bad_records,
                                      lambda seeded_params: stages)
