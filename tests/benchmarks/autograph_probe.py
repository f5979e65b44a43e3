"""Run as a module (`startup.module_program`): imports the registered
experiments and loads a config as `official_ext.train` does, then prints
whether AutoGraph leaves official_ext as written."""
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext.core import experiment_params
from official_ext.core import tf_internals

if __name__ == '__main__':
  experiment_params.load_params('yt8m_demo')
  print('as_written' if tf_internals.excluded_from_autograph()
        else 'converted')
