"""A run's output reads cleanly: each line once, no notice that is no problem.

`official_ext.core.run.run_logging`; the CLI's whole output is checked by
tests/yt8m/test_train.py::test_train_py_writes_model_dir_and_reads_cleanly.
"""
import logging as std_logging
import os

from absl import logging

from official_ext.core.run import run_logging


def _record(msg, args=(), pathname='x.py', level=std_logging.INFO):
  return std_logging.LogRecord('absl', level, pathname, 1, msg, args, None)


def test_filter_drops_duplicates_and_no_problem_notices():
  keep = run_logging._RunFilter().filter  # pylint: disable=protected-access
  orbit = os.path.join('site-packages', 'orbit', 'controller.py')
  assert not keep(_record('train | step: 2', pathname=orbit))
  assert keep(_record('loss is NaN', pathname=orbit,
                      level=std_logging.WARNING))  # Warnings stay.
  assert not keep(_record('Failed to count model FLOPs with error %s', ('e',)))
  assert not keep(_record('Sharding callback duration: %s', (66,)))
  # The init_checkpoint notices go only when no init_checkpoint is set.
  assert not keep(_record('Trying to load pretrained checkpoint from %s',
                          ('',)))
  assert keep(_record('Trying to load pretrained checkpoint from %s',
                      ('/ckpt/a',)))
  assert keep(_record('progress | step 2/4 (50%) | elapsed 0:00:01'))


def test_configure_adds_the_filter_once():
  run_logging.configure()
  run_logging.configure()
  filters = [f for f in logging.get_absl_handler().filters
             if isinstance(f, run_logging._RunFilter)]  # pylint: disable=protected-access
  assert len(filters) == 1
  assert not std_logging.getLogger('tensorflow').handlers
