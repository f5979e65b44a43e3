"""The YouTube-8M starter code's frame-level backbones: frame average, LSTM.

github.com/google/youtube-8m, `frame_level_models.py`: `FrameLevelLogisticModel`
(the mean of the valid frames into a logistic classifier) and `LstmModel` (a
stack of LSTMs whose last layer's final output feeds the video-level
classifier, MoE by default). Re-implemented in tf_keras, not copied. As the
starter's train.py does for every model, each frame is L2-normalized first.

Padded frames (past `num_frames`) are replaced by zeros by selection
(`tf.where`) and left out: of the mean by the mask, of the LSTM by its mask
(the state stops at the last valid frame, as `tf.nn.dynamic_rnn` with
`sequence_length` does), so whatever they hold changes nothing.
"""
from typing import Any, Mapping, Optional, Tuple

import tensorflow as tf, tf_keras

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


class Lstm(tf_keras.layers.Layer):
  """A stack of `layers` LSTMs of `cells` units over the valid frames.

  [batch, frames, F] -> the last layer's output at each video's last valid
  frame, [batch, cells]. Layer i's variables are `lstm_{i}/lstm_cell/
  {kernel [in, 4 cells], recurrent_kernel [cells, 4 cells], bias [4 cells]}`
  (tf_keras' gate order i, f, c, o); the forget gate's bias starts at 1
  (the starter's `BasicLSTMCell(forget_bias=1.0)` adds a constant 1 to a
  zero-initialized bias: the same function at the start of training).
  """

  def __init__(self, cells: int = 1024, layers: int = 2, **kwargs):
    """Args: cells, LSTM units per layer; layers, stacked LSTMs (>= 1)."""
    super().__init__(**kwargs)
    if int(cells) < 1 or int(layers) < 1:
      raise ValueError(f'task.model.backbone.lstm: cells={cells!r} and '
                       f'layers={layers!r}; expected both >= 1.')
    self._config = dict(cells=int(cells), layers=int(layers))
    # RNN(LSTMCell), not LSTM: the same math without the cuDNN branch, so
    # the loop compiles under XLA on every device.
    self._layers = [
        tf_keras.layers.RNN(
            tf_keras.layers.LSTMCell(cells, unit_forget_bias=True),
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
