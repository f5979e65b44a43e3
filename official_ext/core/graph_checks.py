"""In-graph input checks whose errors name what is wrong (tf.data, serving).

Used by the families' decoders: a check is a `tf.debugging.Assert` whose
message (file, record, feature, value) is built only when the check fails.
"""
from typing import Callable, Union

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
  """Fails with `message_fn()` (built only on failure) unless `ok`.

  Args:
    ok: bool scalar.
    message_fn: returns the error text, a string scalar tensor.

  Returns:
    A bool scalar (True); make outputs depend on it with
    `tf.control_dependencies` so the check runs before them.
  """

  def _fail():
    with tf.control_dependencies(
        [tf.debugging.Assert(ok, [message_fn()], summarize=1)]):
      return tf.identity(ok)

  return tf.cond(ok, lambda: tf.constant(True), _fail)


def first_where(values: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
  """The first element of `values` where `mask` is True, for error messages.

  Args:
    values: a tensor [n] (or any shape; flattened in row-major order with
      `mask`).
    mask: bool, `values`' shape; must hold a True (call it in a failing
      check's message function).

  Returns:
    A scalar of `values`' dtype.
  """
  return tf.boolean_mask(values, mask)[0]
