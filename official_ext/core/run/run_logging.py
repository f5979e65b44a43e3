"""What a run prints: each line once, and no notice that is not a problem.

A run through Model Garden and Orbit printed about a thousand lines for the
YT8M demo: every Orbit line twice (Orbit's controller both logs and prints
it), every TensorFlow Python log line twice (TensorFlow's logger has a
handler of its own and also propagates to absl's), a 150-line config dump,
per-checkpoint notices, and at the end Model Garden's "Failed to count model
FLOPs ... error" (its counter cannot trace a subclassed model, which is not a
problem of the run). `configure` keeps each line once:

* Orbit's progress lines (`train | step ...`, ` eval | step ...`,
  `saved checkpoint ...`) go to stdout only (Orbit prints them); their absl
  copies are dropped. Orbit's warnings are kept.
* TensorFlow's Python log records reach absl's handler only.
* Notices that describe no problem are dropped: Model Garden's failed FLOP
  count (`flops_note` says plainly why there is no count), the empty
  `init_checkpoint` notices, the checkpoint saver's sharding timing.
* TensorFlow's C++ INFO and WARNING lines are off unless
  `TF_CPP_MIN_LOG_LEVEL` is set (`quiet_tensorflow_cpp`, before TensorFlow is
  imported). Three C++ lines that no setting reaches remain on a machine
  without a GPU (the CUDA driver probe, XLA's absl notice and its
  first-compilation line).
"""
import logging as std_logging
import os

from absl import logging

_ORBIT_CONTROLLER = os.path.join('orbit', 'controller.py')

# (message prefix, whether the record's first argument must be empty).
_NOTICES = (
    ('Failed to count model FLOPs', False),
    ('Sharding callback duration', False),
    ('Customized initialization is done through the passed `init_fn`', False),
    ('Trying to load pretrained checkpoint from ', True),
    ('No checkpoint file found from ', True),
)


def quiet_tensorflow_cpp() -> None:
  """Hides TensorFlow's C++ INFO and WARNING lines (errors stay).

  Takes effect only before TensorFlow is imported; an explicit
  `TF_CPP_MIN_LOG_LEVEL` wins.
  """
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')


class _RunFilter(std_logging.Filter):
  """Drops the duplicate and the no-problem records (module docstring)."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    if record.levelno >= std_logging.WARNING:
      return True
    if record.pathname.endswith(_ORBIT_CONTROLLER):
      return False  # Orbit prints these lines itself.
    message = str(record.msg)
    for prefix, empty_argument in _NOTICES:
      if message.startswith(prefix):
        if not empty_argument:
          return False
        args = record.args if isinstance(record.args, tuple) else ()
        if not args or not args[0]:
          return False
    return True


_FILTER = _RunFilter()


def configure() -> None:
  """Applies the module's rules to absl's handler and TensorFlow's logger."""
  handler = logging.get_absl_handler()
  if _FILTER not in handler.filters:
    handler.addFilter(_FILTER)
  tf_logger = std_logging.getLogger('tensorflow')
  for tf_handler in list(tf_logger.handlers):
    tf_logger.removeHandler(tf_handler)  # It propagates to absl's handler.


def flops_note(model) -> str:
  """Why Model Garden logged no FLOP count for `model`, in a sentence."""
  return (f'Model FLOPs are not counted here: Model Garden\'s counter traces '
          f'a model with symbolic inputs, and {type(model).__name__} is a '
          'subclassed model without them; `python -m official_ext.benchmark '
          'FAMILY` reports the analytic GFLOP per example.')
