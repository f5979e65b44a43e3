"""What a run prints: each line once, and no notice that is not a problem
(docs/distributed.md, "The training command")."""
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
  """Hides TensorFlow's C++ INFO and WARNING lines unless `TF_CPP_MIN_LOG_LEVEL`
  is set; only before TensorFlow is imported."""
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')


class _RunFilter(std_logging.Filter):
  """Drops Orbit's absl copies of its printed lines and the no-problem notices.
  """

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
