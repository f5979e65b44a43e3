"""SavedModel export of the readout model: `serving_default` (serialized
records) and `serve_tokens` (padded tensors); docs/readout.md, Export."""
import functools
from typing import Dict, Mapping

import tensorflow as tf, tf_keras

from official.core import config_definitions
from official.core import export_base
from official_ext.core.input import graph_checks
from official_ext.readout import configs
from official_ext.readout import dataloader
from official_ext.readout import readout_types
from official_ext.readout import unit_vocabulary as vocabulary_lib

SIGNATURES = ('serving_default', 'serve_tokens')


def _serve(spec: configs.ReadoutSpec, outputs: tf.Tensor) -> tf.Tensor:
  """One task's served output of its head's outputs [..., dim], in its units."""
  return readout_types.get_readout_type(spec).serve(
      spec, configs.denormalize_predictions(spec, outputs))


_PREFIX = 'serve_tokens: '
# serve_tokens' rank-2 inputs and their layout (input_values is
# [batch, tokens, input_dim]).
_SHAPES = (
    ('input_timestamps', '[batch, tokens]'),
    ('input_mask', '[batch, tokens]'),
    ('output_readout_index', '[batch, queries]'),
    ('output_timestamps', '[batch, queries]'),
)
# (input, axis, the input whose length it must have, what the axis counts).
_SAME_LENGTHS = (
    ('input_timestamps', 0, 'input_values', 'rows'),
    ('input_mask', 0, 'input_values', 'rows'),
    ('output_readout_index', 0, 'input_values', 'rows'),
    ('output_timestamps', 0, 'input_values', 'rows'),
    ('input_timestamps', 1, 'input_values', 'tokens (dimension 1)'),
    ('input_mask', 1, 'input_values', 'tokens (dimension 1)'),
    ('output_timestamps', 1, 'output_readout_index', 'queries (dimension 1)'),
)
# (input, whose entries must be finite: 'in token' unmasked tokens, 'at
# query' queries of a routing id other than 0).
_FINITE = (
    ('input_values', 'in token'),
    ('input_timestamps', 'in token'),
    ('output_timestamps', 'at query'),
)


def _same_length(inputs: Mapping[str, tf.Tensor], name: str, axis: int,
                 other: str, what: str):
  """A step: `inputs[name]` has the length of `inputs[other]` on `axis`."""
  tensor, other_tensor = inputs[name], inputs[other]
  return lambda: graph_checks.require(
      tf.equal(tf.shape(tensor)[axis], tf.shape(other_tensor)[axis]),
      lambda: graph_checks.join(
          _PREFIX, name, ' has ', tf.shape(tensor)[axis], f' {what} but ',
          other, ' has ', tf.shape(other_tensor)[axis], '.'))


def _has_a_token(mask: tf.Tensor) -> tf.Tensor:
  """Every row of `mask` [B, n] has an unmasked token."""
  empty = tf.logical_not(tf.reduce_any(mask, axis=1))
  return graph_checks.require(
      tf.logical_not(tf.reduce_any(empty)), lambda: graph_checks.join(
          _PREFIX, 'row ',
          graph_checks.first_where(tf.range(tf.shape(mask)[0]), empty),
          ' has no unmasked input token (input_mask is all False); '
          'expected at least one.'))


def _finite(name: str, tensor: tf.Tensor, used, where: str,
            index: tf.Tensor):
  """A step: `tensor` [B, n] or [B, n, D] finite where `used()` [B, n]."""

  def step():
    bad = tf.logical_not(tf.math.is_finite(tensor))
    if bad.shape.rank == 3:
      bad = tf.reduce_any(bad, axis=2)
    bad = tf.logical_and(used(), bad)

    def message():
      first = tf.where(bad)[0]
      entry = tf.reshape(tensor[first[0], first[1]], [-1])
      value = tf.boolean_mask(entry,
                              tf.logical_not(tf.math.is_finite(entry)))[0]
      return graph_checks.join(
          _PREFIX, 'row ', first[0], f' of {name} has a NaN or infinite '
          'value (', value, ') ', where, ' ', first[1], *(
              (', an unmasked token.',) if where == 'in token' else (
                  ' (routing id ', tf.gather_nd(index, first), ').')))
    return graph_checks.require(tf.logical_not(tf.reduce_any(bad)), message)
  return step

class ReadoutExportModule(export_base.ExportModule):
  """Export module of `official_ext.readout.task.ReadoutTask` models."""

  def __init__(self, params: config_definitions.ExperimentConfig,
               model: tf_keras.Model):
    """Args: params: the experiment; model: the restored ReadoutModel."""
    super().__init__(params, model)
    self._data = params.task.validation_data.replace(
        batching='padded', drop_remainder=False, is_training=False)
    self._units = getattr(model, 'units', None)
    if self._units is not None:
      stored = model.unit_vocabulary.numpy().decode('utf-8')
      if stored != vocabulary_lib.to_json(self._units):
        raise ValueError(
            'The restored checkpoint holds another unit vocabulary than '
            'task.vocabulary_file (its `unit_vocabulary` variable: '
            f'{stored[:200]}...); export with the vocabulary it was trained '
            'with.')
    self._parser = dataloader.Parser(self._data, params.task.readouts,
                                     params.task.task_vocabulary,
                                     units=self._units)
    self._input_dim = int(self._data.input_dim)
    # {task: head outputs -> served output}: de-normalised (a readout with
    # target normalisation), then its readout type's serving function.
    self._serve_fns = {
        spec.name: functools.partial(_serve, spec)
        for spec in params.task.readouts}

  def _predict(self, batch: Mapping[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
    embs = self.model.output_embeddings(batch, training=False)
    index = tf.cast(batch['output_readout_index'], tf.int32)
    outputs = {name: self._serve_fns[name](tf.cast(values, tf.float32))
               for name, (values, _) in
               self.model.readout.call_static(embs, index).items()}
    outputs['output_readout_index'] = index
    return outputs

  def serve(self, examples: tf.Tensor) -> Dict[str, tf.Tensor]:
    """Serialized records [B] -> the served outputs, `targets` and `weights`."""
    sources = tf.strings.join(['input examples[', tf.strings.as_string(
        tf.range(tf.shape(examples)[0])), ']'])
    ds = tf.data.Dataset.from_tensor_slices((examples, sources)).map(
        lambda e, s: self._parser.parse(e, source=s))
    num = tf.maximum(tf.cast(tf.shape(examples)[0], tf.int64), 1)
    batch = dataloader.batch_examples(
        ds, self._data, batch_size=num,
        max_target_size=self._parser.max_target_size).get_single_element()
    outputs = self._predict(batch)
    outputs['targets'] = batch['output_targets']
    outputs['weights'] = batch['output_weights']
    return outputs

  def _unit_checks(self, mask, unit_ids, session_ids):
    """The unit-token checks of `serve_tokens` (steps of `in_order`)."""
    p = 'serve_tokens: '
    units = self._units
    bad_unit = lambda: tf.logical_and(mask, tf.logical_or(
        unit_ids < 1, unit_ids >= units.num_unit_ids))
    bad_session = lambda: tf.logical_or(session_ids < 1,
                                        session_ids >= units.num_session_ids)

    def unit_message():
      first = tf.where(bad_unit())[0]
      return graph_checks.join(
          p, 'row ', first[0], ' of input_unit_ids has unit id ',
          tf.gather_nd(unit_ids, first), ' at token ', first[1],
          f', which is not in the unit vocabulary (ids 1..'
          f'{len(units.units)}).')

    return [
        lambda: graph_checks.require_shape(
            unit_ids, p + 'input_unit_ids', [None, None], '[batch, tokens]'),
        lambda: graph_checks.require_shape(
            session_ids, p + 'session_ids', [None], '[batch]'),
        lambda: graph_checks.require(
            tf.reduce_all(tf.equal(tf.shape(unit_ids), tf.shape(mask))),
            lambda: graph_checks.join(
                p, 'input_unit_ids has ', tf.shape(unit_ids)[0], ' rows of ',
                tf.shape(unit_ids)[1], ' tokens but input_mask ',
                tf.shape(mask)[0], ' rows of ', tf.shape(mask)[1], '.')),
        lambda: graph_checks.require(
            tf.equal(tf.shape(session_ids)[0], tf.shape(mask)[0]),
            lambda: graph_checks.join(
                p, 'session_ids has ', tf.shape(session_ids)[0],
                ' rows but input_mask has ', tf.shape(mask)[0], '.')),
        lambda: graph_checks.require(
            tf.logical_not(tf.reduce_any(bad_unit())), unit_message),
        lambda: graph_checks.require(
            tf.logical_not(tf.reduce_any(bad_session())),
            lambda: graph_checks.join(
                p, 'row ', graph_checks.first_where(
                    tf.range(tf.size(session_ids)), bad_session()),
                ' has session id ', graph_checks.first_where(
                    session_ids, bad_session()),
                f', which is not in the unit vocabulary (ids 1..'
                f'{len(units.sessions)}).')),
    ]

  def _token_checks(self, inputs: Mapping[str, tf.Tensor], unit_checks=()):
    """The checks of `serve_tokens`, in order: `unit_checks`, the shapes,
    agreeing lengths (`_SAME_LENGTHS`), a token per row, known routing ids,
    finite values (`_FINITE`)."""
    dim = self._input_dim
    index = inputs['output_readout_index']
    shapes = [('input_values', [None, None, dim],
               f'[batch, tokens, {dim}] (DataConfig.input_dim {dim})')]
    shapes += [(name, [None, None], layout) for name, layout in _SHAPES]
    used = {'in token': lambda: inputs['input_mask'],
            'at query': lambda: tf.not_equal(index, 0)}
    return graph_checks.in_order(
        list(unit_checks) +
        [functools.partial(graph_checks.require_shape, inputs[name],
                           _PREFIX + name, shape, layout)
         for name, shape, layout in shapes] +
        [_same_length(inputs, *row) for row in _SAME_LENGTHS] +
        [functools.partial(_has_a_token, inputs['input_mask']),
         functools.partial(self._known_ids, index)] +
        [_finite(name, inputs[name], used[where], where, index)
         for name, where in _FINITE])

  def _known_ids(self, index: tf.Tensor) -> tf.Tensor:
    """Every routing id of `index` is 0 or a readout's."""
    ids = sorted(self.model.readout.readout_ids.values())
    known = tf.equal(index, 0)
    for i in ids:
      known = tf.logical_or(known, tf.equal(index, i))

    def message():
      first = tf.where(tf.logical_not(known))[0]
      return graph_checks.join(
          _PREFIX, 'row ', first[0], ' of output_readout_index has id ',
          tf.gather_nd(index, first), ' at query ', first[1],
          f", which is neither 0 (padding) nor a readout's id ({ids}: "
          f'{self.model.readout.readout_ids}).')
    return graph_checks.require(tf.reduce_all(known), message)

  def serve_tokens(self, input_values, input_timestamps, input_mask,
                   output_readout_index, output_timestamps,
                   input_unit_ids=None, session_ids=None
                   ) -> Dict[str, tf.Tensor]:
    """A padded batch -> the served outputs; unit tokens also take
    `input_unit_ids` and `session_ids`."""
    unit_inputs, unit_checks = {}, []
    if self._units is not None:
      if input_unit_ids is None or session_ids is None:
        raise ValueError('serve_tokens of a unit-token model needs '
                         'input_unit_ids and session_ids.')
      input_unit_ids = tf.cast(input_unit_ids, tf.int32)
      session_ids = tf.cast(session_ids, tf.int32)
      unit_checks = self._unit_checks(tf.cast(input_mask, tf.bool),
                                      input_unit_ids, session_ids)
    input_values = tf.convert_to_tensor(input_values, tf.float32)
    input_timestamps = tf.convert_to_tensor(input_timestamps, tf.float32)
    input_mask = tf.cast(input_mask, tf.bool)
    output_readout_index = tf.cast(output_readout_index, tf.int32)
    output_timestamps = tf.convert_to_tensor(output_timestamps, tf.float32)
    checks = self._token_checks(
        {'input_values': input_values, 'input_timestamps': input_timestamps,
         'input_mask': input_mask,
         'output_readout_index': output_readout_index,
         'output_timestamps': output_timestamps}, unit_checks)
    with tf.control_dependencies(checks):
      if self._units is not None:
        unit_inputs = {
            'input_unit_ids': tf.where(input_mask, input_unit_ids, 0),
            'session_ids': tf.identity(session_ids)}
      # Masked tokens and padding queries: zeros, by selection.
      input_values = tf.where(input_mask[:, :, tf.newaxis], input_values,
                              tf.zeros_like(input_values))
      input_timestamps = tf.where(input_mask, input_timestamps,
                                  tf.zeros_like(input_timestamps))
      output_timestamps = tf.where(tf.not_equal(output_readout_index, 0),
                                   output_timestamps,
                                   tf.zeros_like(output_timestamps))
      input_mask = tf.identity(input_mask)
      output_readout_index = tf.identity(output_readout_index)
    return self._predict({
        'input_values': input_values, 'input_timestamps': input_timestamps,
        'input_mask': input_mask,
        'output_readout_index': output_readout_index,
        'output_timestamps': output_timestamps, **unit_inputs})

  def get_inference_signatures(
      self, function_keys: Mapping[str, str]) -> Dict[str, object]:
    signatures = {}
    for key, name in function_keys.items():
      if key == 'serving_default':
        signatures[name] = tf.function(self.serve).get_concrete_function(
            tf.TensorSpec([None], tf.string, name='examples'))
      elif key == 'serve_tokens':
        signatures[name] = tf.function(self.serve_tokens).get_concrete_function(
            tf.TensorSpec([None, None, self._input_dim], tf.float32,
                          name='input_values'),
            tf.TensorSpec([None, None], tf.float32, name='input_timestamps'),
            tf.TensorSpec([None, None], tf.bool, name='input_mask'),
            tf.TensorSpec([None, None], tf.int32,
                          name='output_readout_index'),
            tf.TensorSpec([None, None], tf.float32, name='output_timestamps'),
            *([] if self._units is None else [
                tf.TensorSpec([None, None], tf.int32, name='input_unit_ids'),
                tf.TensorSpec([None], tf.int32, name='session_ids')]))
      else:
        raise ValueError(f'Unknown readout signature {key!r}; expected one of '
                         f'{SIGNATURES}.')
    return signatures
