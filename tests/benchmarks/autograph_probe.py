"""Run as a module (`startup.module_program`): imports the registered
experiments and loads a config as `official_ext.train` does, then prints
whether AutoGraph leaves official_ext as written."""
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext.core import experiment_params
from official_ext.core import tf_internals

if __name__ == '__main__':
  experiment_params.load_params('yt8m_demo')
  config = tf_internals._private('tensorflow.python.autograph.core.config')  # pylint: disable=protected-access
  print('as_written' if any(
      isinstance(rule, config.DoNotConvert) and rule.matches('official_ext')
      for rule in config.CONVERSION_RULES) else 'converted')
