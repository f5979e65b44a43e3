"""Building blocks of the readout model: time embedding, attention blocks,
the shared `TokenEncoder` (several task models may hold one) and the query
decoder."""
import math
from typing import Any, Dict, Optional, Tuple

import tensorflow as tf, tf_keras


class TimeEmbedding(tf_keras.layers.Layer):
  """Timestamps (s) [...] -> geometric-period sinusoids -> Dense [..., H]."""

  def __init__(self, hidden_size: int, min_period: float = 0.02,
               max_period: float = 20.0, **kwargs):
    super().__init__(**kwargs)
    if hidden_size < 2 or not 0 < min_period < max_period:
      raise ValueError(f'TimeEmbedding: hidden_size {hidden_size} (>= 2), '
                       f'periods {min_period} < {max_period} (> 0) expected.')
    self._config = dict(hidden_size=hidden_size, min_period=min_period,
                        max_period=max_period)
    n = hidden_size // 2
    periods = [min_period * (max_period / min_period) ** (i / max(n - 1, 1))
               for i in range(n)]
    self._frequencies = tf.constant([2 * math.pi / p for p in periods],
                                    tf.float32)
    self.projection = tf_keras.layers.Dense(hidden_size, name='projection')

  def call(self, timestamps: tf.Tensor) -> tf.Tensor:
    angles = tf.cast(timestamps, tf.float32)[..., None] * self._frequencies
    return self.projection(tf.concat([tf.sin(angles), tf.cos(angles)], -1))

  def get_config(self) -> Dict[str, Any]:
    return dict(super().get_config(), **self._config)


class AttentionBlock(tf_keras.layers.Layer):
  """Pre-norm attention + feed-forward block with residuals."""

  def __init__(self, hidden_size: int, num_heads: int, intermediate_size: int,
               dropout_rate: float = 0.0, **kwargs):
    super().__init__(**kwargs)
    if hidden_size % num_heads:
      raise ValueError(f'hidden_size {hidden_size} is not a multiple of '
                       f'num_heads {num_heads}.')
    self._config = dict(hidden_size=hidden_size, num_heads=num_heads,
                        intermediate_size=intermediate_size,
                        dropout_rate=dropout_rate)
    self.query_norm = tf_keras.layers.LayerNormalization(
        epsilon=1e-5, name='query_norm')
    self.context_norm = tf_keras.layers.LayerNormalization(
        epsilon=1e-5, name='context_norm')
    self.attention = tf_keras.layers.MultiHeadAttention(
        num_heads, hidden_size // num_heads, dropout=dropout_rate,
        name='attention')
    self.ffn_norm = tf_keras.layers.LayerNormalization(
        epsilon=1e-5, name='ffn_norm')
    self.ffn_in = tf_keras.layers.Dense(intermediate_size, activation='gelu',
                                        name='ffn_in')
    self.ffn_out = tf_keras.layers.Dense(hidden_size, name='ffn_out')
    self.dropout = tf_keras.layers.Dropout(dropout_rate)

  def call(self, x: tf.Tensor, context: Optional[tf.Tensor] = None,
           mask: Optional[tf.Tensor] = None,
           query_slots: Optional[tf.Tensor] = None,
           block_length: Optional[tf.Tensor] = None,
           training=None) -> tf.Tensor:
    """The block on `x` [B, Tq, H] (context [B, Tk, H] or None, mask [B, Tk]).

    With `query_slots` (`chained_slots`) `x` holds chained queries [N, 1, H]
    that attend in per-sample blocks of `block_length` to their own sample's
    context (keys and values projected once per sample), as padded would.
    """
    q = self.query_norm(x)
    kv = q if context is None else self.context_norm(context)
    if query_slots is not None:
      if context is None or block_length is None:
        raise ValueError('AttentionBlock: query_slots (chained queries) need '
                         'a context to attend to and a block_length.')
      q = tf.scatter_nd(query_slots, q[:, 0, :], tf.stack(
          [tf.shape(kv)[0], block_length, tf.shape(q)[-1]]))
    attention_mask = None
    if mask is not None:
      attention_mask = tf.logical_and(
          tf.ones_like(q[..., :1], tf.bool), mask[:, None, :])
    attended = self.attention(q, kv, attention_mask=attention_mask,
                              training=training)
    if query_slots is not None:
      attended = tf.gather_nd(attended, query_slots)[:, None, :]
    x = x + self.dropout(attended, training=training)
    h = self.ffn_out(self.ffn_in(self.ffn_norm(x)))
    return x + self.dropout(h, training=training)

  def get_config(self) -> Dict[str, Any]:
    return dict(super().get_config(), **self._config)


def chained_slots(batch_index: tf.Tensor, batch_size: tf.Tensor
                  ) -> Tuple[tf.Tensor, tf.Tensor]:
  """(slots int32 [N, 2]: each chained query's (sample, rank in its sample),
  block_length: the most queries of one sample) of `batch_index` [N]."""
  index = tf.cast(batch_index, tf.int32)
  counts = tf.math.bincount(index, minlength=batch_size,
                            maxlength=batch_size, dtype=tf.int32)
  starts = tf.cumsum(counts, exclusive=True)
  order = tf.argsort(index, stable=True)
  rank_in_order = (tf.range(tf.size(index)) -
                   tf.gather(starts, tf.gather(index, order)))
  rank = tf.gather(rank_in_order, tf.math.invert_permutation(order))
  block_length = tf.reduce_max(tf.concat([counts, [0]], 0))
  return tf.stack([index, rank], -1), block_length


class ZeroRowNormal(tf_keras.initializers.Initializer):
  """N(0, stddev) with row 0 zero: a table whose row 0 is padding."""

  def __init__(self, stddev: float = 0.02):
    self.stddev = float(stddev)

  def __call__(self, shape, dtype=None, **kwargs):
    values = tf_keras.initializers.RandomNormal(stddev=self.stddev)(
        shape, dtype=dtype)
    return tf.concat([tf.zeros_like(values[:1]), values[1:]], 0)

  def get_config(self) -> Dict[str, Any]:
    return {'stddev': self.stddev}


class PaddedEmbedding(tf_keras.layers.Embedding):
  """An embedding table drawn from N(0, stddev) whose row 0 (padding) is zero
  and, its lookups masked, never gets a gradient."""

  def __init__(self, input_dim: int, output_dim: int, stddev: float = 0.02,
               **kwargs):
    kwargs.pop('embeddings_initializer', None)
    super().__init__(input_dim, output_dim,
                     embeddings_initializer=ZeroRowNormal(stddev), **kwargs)
    self._stddev = float(stddev)

  def call(self, inputs):
    ids = tf.cast(inputs, tf.int32)
    rows = super().call(ids)
    return rows * tf.cast(tf.not_equal(ids, 0), rows.dtype)[..., None]

  def get_config(self) -> Dict[str, Any]:
    config = super().get_config()
    config.pop('embeddings_initializer', None)
    return dict(config, stddev=self._stddev)


class TokenEncoder(tf_keras.layers.Layer):
  """The shared encoder over timestamped tokens.

  `call(tokens [B, n, H], timestamps [B, n], mask bool [B, n])` ->
  (encoded [B, L, H], encoded_mask [B, L]): L = n, or with `num_latents` the
  Perceiver latents. Padding tokens never influence valid outputs.
  """

  def __init__(self, hidden_size: int = 64, num_heads: int = 4,
               num_layers: int = 2, num_latents: int = 0,
               intermediate_size: int = 128, dropout_rate: float = 0.0,
               min_time_period: float = 0.02, max_time_period: float = 20.0,
               **kwargs):
    super().__init__(**kwargs)
    self._config = dict(hidden_size=hidden_size, num_heads=num_heads,
                        num_layers=num_layers, num_latents=num_latents,
                        intermediate_size=intermediate_size,
                        dropout_rate=dropout_rate,
                        min_time_period=min_time_period,
                        max_time_period=max_time_period)
    self.hidden_size = hidden_size
    block = lambda name: AttentionBlock(hidden_size, num_heads,
                                        intermediate_size, dropout_rate,
                                        name=name)
    self.time_embedding = TimeEmbedding(hidden_size, min_time_period,
                                        max_time_period, name='time_embedding')
    self._num_latents = num_latents
    if num_latents:
      self.latents = self.add_weight(
          'latents', [num_latents, hidden_size],
          initializer=tf_keras.initializers.TruncatedNormal(stddev=0.02))
      self.latent_cross_attention = block('latent_cross_attention')
    self.blocks = [block(f'block_{i}') for i in range(num_layers)]
    self.output_norm = tf_keras.layers.LayerNormalization(
        epsilon=1e-5, name='output_norm')

  def call(self, tokens: tf.Tensor, timestamps: tf.Tensor, mask: tf.Tensor,
           training=None) -> Tuple[tf.Tensor, tf.Tensor]:
    mask = tf.cast(mask, tf.bool)
    x = tokens + self.time_embedding(timestamps)
    if self._num_latents:
      batch = tf.shape(x)[0]
      latents = tf.tile(self.latents[None], [batch, 1, 1])
      x = self.latent_cross_attention(latents, context=x, mask=mask,
                                      training=training)
      mask = tf.ones([batch, self._num_latents], tf.bool)
    for block in self.blocks:
      x = block(x, mask=mask, training=training)
    return self.output_norm(x), mask

  def get_config(self) -> Dict[str, Any]:
    return dict(super().get_config(), **self._config)


class QueryDecoder(tf_keras.layers.Layer):
  """Readout queries -> output embeddings.

  A query is task_embedding(routing id) + time embedding (+ the optional
  `query_embedding`, e.g. the session's), through `num_layers` blocks of
  cross-attention to the encoder output; queries never attend to each
  other. `call` takes padded queries, `call_varlen` chained ones.
  """

  def __init__(self, num_task_ids: int, hidden_size: int = 64,
               num_heads: int = 4, num_layers: int = 1,
               intermediate_size: int = 128, dropout_rate: float = 0.0,
               min_time_period: float = 0.02, max_time_period: float = 20.0,
               embedding_stddev: Optional[float] = None, **kwargs):
    super().__init__(**kwargs)
    self._config = dict(num_task_ids=num_task_ids, hidden_size=hidden_size,
                        num_heads=num_heads, num_layers=num_layers,
                        intermediate_size=intermediate_size,
                        dropout_rate=dropout_rate,
                        min_time_period=min_time_period,
                        max_time_period=max_time_period,
                        embedding_stddev=embedding_stddev)
    self._num_task_ids = num_task_ids
    self.task_embedding = tf_keras.layers.Embedding(
        num_task_ids, hidden_size, name='task_embedding',
        embeddings_initializer=(
            'uniform' if embedding_stddev is None else
            tf_keras.initializers.RandomNormal(stddev=embedding_stddev)))
    self.time_embedding = TimeEmbedding(hidden_size, min_time_period,
                                        max_time_period, name='time_embedding')
    self.blocks = [AttentionBlock(hidden_size, num_heads, intermediate_size,
                                  dropout_rate, name=f'block_{i}')
                   for i in range(num_layers)]
    self.output_norm = tf_keras.layers.LayerNormalization(
        epsilon=1e-5, name='output_norm')

  def _queries(self, readout_index, timestamps, query_embedding):
    # Ids without a row (possible only with ids no head reads) use row 0.
    index = tf.cast(readout_index, tf.int32)
    index = tf.where((index >= 0) & (index < self._num_task_ids), index, 0)
    queries = self.task_embedding(index) + self.time_embedding(timestamps)
    if query_embedding is not None:
      queries += tf.cast(query_embedding, queries.dtype)
    return queries

  def call(self, readout_index, timestamps, encoded, encoded_mask,
           query_embedding=None, training=None) -> tf.Tensor:
    x = self._queries(readout_index, timestamps, query_embedding)
    for block in self.blocks:
      x = block(x, context=encoded, mask=encoded_mask, training=training)
    return self.output_norm(x)

  def call_varlen(self, readout_index, timestamps, batch_index, encoded,
                  encoded_mask, query_embedding=None,
                  training=None) -> tf.Tensor:
    x = self._queries(readout_index, timestamps,
                      query_embedding)[:, None, :]  # [N, 1, H]
    slots, block_length = chained_slots(batch_index, tf.shape(encoded)[0])
    for block in self.blocks:
      x = block(x, context=encoded, mask=encoded_mask, query_slots=slots,
                block_length=block_length, training=training)
    return self.output_norm(x)[:, 0, :]

  def get_config(self) -> Dict[str, Any]:
    return dict(super().get_config(), **self._config)
