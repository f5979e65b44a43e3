"""Shared pytest setup: quiet TensorFlow, two logical CPU devices."""
import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import tensorflow as tf  # pylint: disable=g-import-not-at-top

# Two logical CPU devices let tests run MirroredStrategy with 2 replicas.
# This must happen before TensorFlow initializes its devices.
_cpus = tf.config.list_physical_devices('CPU')
try:
  tf.config.set_logical_device_configuration(
      _cpus[0], [tf.config.LogicalDeviceConfiguration(),
                 tf.config.LogicalDeviceConfiguration()])
except RuntimeError:  # Already initialized (should not happen under pytest).
  pass
