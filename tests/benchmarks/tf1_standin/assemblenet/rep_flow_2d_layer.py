"""Stand-in: the batch-norm flags the original's layers read."""
from absl import flags

flags.DEFINE_float('bn_decay', 0.99, 'batch norm decay')
flags.DEFINE_float('bn_epsilon', 1e-5, 'batch norm epsilon')
