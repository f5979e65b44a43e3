"""In-graph input checks whose errors name what is wrong (tf.data, serving).

Used by the families' decoders and serving signatures: a check is a
`tf.debugging.Assert` whose message (file, record, feature, value) is built
only when the check fails.
"""
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


def in_order(steps: Sequence[Callable[[], tf.Tensor]]) -> List[tf.Tensor]:
  """Builds checks so that each runs only after the previous ones passed.

  Args:
    steps: functions building one check each (`require`); a later step may
      rely on what the earlier ones checked (e.g. index a dimension whose
      existence was checked).

  Returns:
    [the last check]; outputs made under `tf.control_dependencies` of it run
    after every step.
  """
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
  """Checks the rank and the known dimensions of `value` when it runs.

  A serving signature declares its inputs' rank, so in its graph the rank of
  an input is a constant (TensorFlow folds `tf.rank`) whatever tensor a
  caller feeds: TF Serving and concrete functions do not check it. The rank
  is therefore counted from the entries of the runtime shape.

  Args:
    value: the tensor.
    name: how the message names it, e.g. 'serve: input `frames`'.
    expected: its dimensions, None for any size.
    layout: the expected shape in words, e.g. '[batch, frames, 1152]'.

  Returns:
    The check (`require`); the message gives the shape `value` has.
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
