"""SavedModel export of the readout model (serving signatures).

Serving outputs have static structure: every head runs on every query
position (the static routing of `MultitaskReadout.call_static`), and the
caller keeps, for each query, the output of its task.

Signatures:
* `serving_default(examples)`: a batch of serialized `tf.train.Example`
  records in the dataset's format (`dataloader`), parsed and validated by the
  same `dataloader.Parser` as evaluation (a bad record fails naming
  `input examples[i]`) and padded like an evaluation batch.
* `serve_tokens(input_values, input_timestamps, input_mask,
  output_readout_index, output_timestamps)`: an already padded batch,
  float32 [B, n_in, input_dim], float32 [B, n_in], bool [B, n_in], int32
  [B, n_out] (0: padding), float32 [B, n_out].

Both return `output_readout_index` int32 [B, n_out] and, per task, `<task>`
float32 [B, n_out, dim]: the head's output at every position (values,
logits or log-rates by the task's type); it is the task's prediction where
`output_readout_index` equals the task's id. `serving_default` also returns
`targets` float32 [B, n_out, T] and `weights` float32 [B, n_out] of the
records.
"""
from typing import Dict, Mapping

import tensorflow as tf, tf_keras

from official.core import config_definitions
from official.core import export_base
from official_ext.readout import dataloader

SIGNATURES = ('serving_default', 'serve_tokens')


class ReadoutExportModule(export_base.ExportModule):
  """Export module of `official_ext.readout.task.ReadoutTask` models."""

  def __init__(self, params: config_definitions.ExperimentConfig,
               model: tf_keras.Model):
    """Args: params: the experiment; model: the restored ReadoutModel."""
    super().__init__(params, model)
    self._data = params.task.validation_data.replace(
        batching='padded', drop_remainder=False, is_training=False)
    self._parser = dataloader.Parser(self._data, params.task.readouts,
                                     params.task.task_vocabulary)
    self._input_dim = int(self._data.input_dim)

  def _predict(self, batch: Mapping[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
    embs = self.model.output_embeddings(batch, training=False)
    index = tf.cast(batch['output_readout_index'], tf.int32)
    outputs = {name: tf.cast(values, tf.float32) for name, (values, _) in
               self.model.readout.call_static(embs, index).items()}
    outputs['output_readout_index'] = index
    return outputs

  def serve(self, examples: tf.Tensor) -> Dict[str, tf.Tensor]:
    """Serialized records [B] -> outputs (see the module docstring)."""
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

  def serve_tokens(self, input_values, input_timestamps, input_mask,
                   output_readout_index, output_timestamps
                   ) -> Dict[str, tf.Tensor]:
    """A padded batch -> outputs (see the module docstring)."""
    check = tf.debugging.assert_equal(
        tf.shape(input_values)[2], self._input_dim, message=(
            'serve_tokens: input_values has the wrong feature width (last '
            f'dimension); expected {self._input_dim} (DataConfig.input_dim).'))
    with tf.control_dependencies([check]):
      input_values = tf.identity(input_values)
    return self._predict({
        'input_values': input_values, 'input_timestamps': input_timestamps,
        'input_mask': input_mask,
        'output_readout_index': output_readout_index,
        'output_timestamps': output_timestamps})

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
            tf.TensorSpec([None, None], tf.float32, name='output_timestamps'))
      else:
        raise ValueError(f'Unknown readout signature {key!r}; expected one of '
                         f'{SIGNATURES}.')
    return signatures
