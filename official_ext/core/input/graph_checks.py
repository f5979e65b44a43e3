"""In-graph input checks whose errors name what is wrong."""
from typing import Callable, List, Optional, Sequence, Union

import tensorflow as tf


def join(*parts: Union[str, tf.Tensor]) -> tf.Tensor:
  """Joins python strings and (string or numeric) scalar tensors."""
  pieces = []
  for part in parts:
    if isinstance(part, str):
      pieces.append(tf.constant(part))
    elif part.dtype == tf.string:
      pieces.append(part)
    else:
      pieces.append(tf.strings.as_string(part))
  return tf.strings.join(pieces)


def require(ok: tf.Tensor, message_fn: Callable[[], tf.Tensor]) -> tf.Tensor:
  """A check failing with `message_fn()` unless `ok` (control dependency)."""

  def _fail():
    with tf.control_dependencies(
        [tf.debugging.Assert(ok, [message_fn()], summarize=1)]):
      return tf.identity(ok)

  return tf.cond(ok, lambda: tf.constant(True), _fail)


def first_where(values: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
  """The first of `values` where `mask` holds, for a message."""
  return tf.boolean_mask(values, mask)[0]


def in_order(steps: Sequence[Callable[[], tf.Tensor]]) -> List[tf.Tensor]:
  """[the last check] of `steps`, each run after the previous passed."""
  deps = []
  for step in steps:
    with tf.control_dependencies(deps):
      deps = [step()]
  return deps


def shape_text(shape: tf.Tensor) -> tf.Tensor:
  """'[2, 6, 36]' of an int shape vector, for messages."""
  return tf.strings.join(['[', tf.strings.reduce_join(
      tf.strings.as_string(shape), separator=', '), ']'])


def require_shape(value: tf.Tensor, name: str,
                  expected: Sequence[Optional[int]], layout: str) -> tf.Tensor:
  """Checks `value`'s rank and `expected` dims at run time.

  `name` and `layout` (e.g. '[batch, frames, 1152]') are for the message.
  """
  shape = tf.shape(value)
  rank = tf.reduce_sum(tf.cast(shape >= 0, tf.int32))  # Not folded.
  ok = tf.equal(rank, len(expected))
  padded = tf.concat([shape, -tf.ones([len(expected)], shape.dtype)],
                     0)[:len(expected)]
  for i, size in enumerate(expected):
    if size is not None:
      ok = tf.logical_and(ok, tf.equal(padded[i], size))
  return require(ok, lambda: join(name, ' has shape ', shape_text(shape),
                                  f'; expected {layout}.'))
