"""The YouTube-8M starter code's frame-level backbones: frame average and
LSTM (docs/yt8m.md#model-zoo).
"""
from typing import Any, Mapping, Optional, Tuple

import tensorflow as tf, tf_keras

from official_ext.yt8m.modeling import factory
from official_ext.yt8m.modeling import layers as yt8m_layers


def _valid_frames(inputs: tf.Tensor, num_frames: Optional[tf.Tensor]
                  ) -> Tuple[tf.Tensor, Optional[tf.Tensor]]:
  """(L2-normalized float32 frames, padding zeroed; bool [batch, frames]
  mask of the valid frames or None)."""
  x, valid = yt8m_layers.mask_frames(inputs, num_frames)
  return tf.nn.l2_normalize(x, axis=-1), valid


class FrameAverage(tf_keras.layers.Layer):
  """The mean of the (L2-normalized) valid frames: [batch, frames, F] ->
  [batch, F]. No variables: with the logistic head it is the starter's
  `FrameLevelLogisticModel`."""

  def call(self, inputs: tf.Tensor, num_frames: Optional[tf.Tensor] = None,
           training=None) -> tf.Tensor:
    """Args: inputs float [batch, frames, F]; num_frames optional int
    [batch] valid frames (None: all). Returns [batch, F]."""
    del training  # Unused.
    x, valid = _valid_frames(inputs, num_frames)
    mask = None if valid is None else tf.cast(valid, x.dtype)[:, :, tf.newaxis]
    return tf.cast(yt8m_layers.pool_frames(x, 'average', mask),
                   self.compute_dtype)


class BasicLstmCell(tf_keras.layers.Layer):
  """The starter's LSTM cell, TF1's `BasicLSTMCell(forget_bias=1.0)`: one
  Glorot-uniform `kernel` [inputs + units, 4 units] over the concatenated
  input and output, a zero `bias` [4 units], gates in its order (i, j, f,
  o) and 1 added to the forget gate. For `tf_keras.layers.RNN`; the state
  is [h, c]."""

  def __init__(self, units: int, forget_bias: float = 1.0, **kwargs):
    super().__init__(**kwargs)
    self.units = int(units)
    self.forget_bias = float(forget_bias)
    self.state_size = [self.units, self.units]
    self.output_size = self.units

  def build(self, input_shape):
    depth = int(input_shape[-1])
    self.kernel = self.add_weight(
        'kernel', shape=[depth + self.units, 4 * self.units],
        initializer='glorot_uniform')
    self.bias = self.add_weight('bias', shape=[4 * self.units],
                                initializer='zeros')
    super().build(input_shape)

  def call(self, inputs, states):
    h, c = states
    gates = tf.matmul(tf.concat([inputs, h], axis=1), self.kernel) + self.bias
    i, j, f, o = tf.split(gates, 4, axis=1)
    c = c * tf.sigmoid(f + self.forget_bias) + tf.sigmoid(i) * tf.tanh(j)
    h = tf.tanh(c) * tf.sigmoid(o)
    return h, [h, c]

  def get_config(self) -> Mapping[str, Any]:
    config = super().get_config()
    config.update(units=self.units, forget_bias=self.forget_bias)
    return config


class Lstm(tf_keras.layers.Layer):
  """A stack of `layers` starter LSTM cells (`BasicLstmCell`) of `cells`
  units over the valid frames.

  [batch, frames, F] -> the last layer's output at each video's last valid
  frame, [batch, cells]. Layer i's variables are
  `lstm_{i}/basic_lstm_cell/{kernel [in + cells, 4 cells], bias [4 cells]}`,
  as the starter's `MultiRNNCell` of `BasicLSTMCell`s has them.
  """

  def __init__(self, cells: int = 1024, layers: int = 2, **kwargs):
    """Args: cells, LSTM units per layer; layers, stacked LSTMs (>= 1)."""
    super().__init__(**kwargs)
    if int(cells) < 1 or int(layers) < 1:
      raise ValueError(f'task.model.backbone.lstm: cells={cells!r} and '
                       f'layers={layers!r}; expected both >= 1.')
    self._config = dict(cells=int(cells), layers=int(layers))
    self._layers = [
        tf_keras.layers.RNN(
            BasicLstmCell(cells, name='basic_lstm_cell'),
            return_sequences=i < layers - 1, name=f'lstm_{i}')
        for i in range(layers)]

  def call(self, inputs: tf.Tensor, num_frames: Optional[tf.Tensor] = None,
           training=None) -> tf.Tensor:
    """Args: inputs float [batch, frames, F]; num_frames optional int
    [batch] valid frames (None: all). Returns [batch, cells]."""
    x, valid = _valid_frames(inputs, num_frames)
    for layer in self._layers:
      x = layer(x, mask=valid, training=training)
    return x

  def get_config(self) -> Mapping[str, Any]:
    config = super().get_config()
    config.update(self._config)
    return config


@factory.register_backbone_builder('frame_average')
def build_frame_average(model_config, l2_regularizer,
                        name='backbone') -> FrameAverage:
  del model_config, l2_regularizer  # No variables.
  return FrameAverage(name=name)


@factory.register_backbone_builder('lstm')
def build_lstm(model_config, l2_regularizer, name='backbone') -> Lstm:
  del l2_regularizer  # The starter regularizes only the classifier.
  return Lstm(name=name, **model_config.backbone.lstm.as_dict())
