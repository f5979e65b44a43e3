"""A run's output reads cleanly: each line once, no notice that is no problem.

`official_ext.core.run_logging`; the CLI check runs the tiny YT8M demo config
of tests/yt8m/test_train.py for two steps.
"""
import logging as std_logging
import os
import re
import subprocess
import sys

from absl import logging

from official_ext.core import run_logging
from tests.yt8m.test_train import _tiny_overrides
from tests.yt8m.test_train import _yaml


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


def test_cli_prints_each_line_once_and_the_metrics_last(tmp_path):
  overrides = _tiny_overrides(tmp_path / 'cache', train_steps=2)
  overrides['trainer'].update(steps_per_loop=1, checkpoint_interval=2,
                              summary_interval=1, validation_interval=2)
  config = _yaml(tmp_path / 'tiny.yaml', overrides)
  env = {k: v for k, v in os.environ.items() if k != 'TF_CPP_MIN_LOG_LEVEL'}
  result = subprocess.run(
      [sys.executable, '-m', 'official_ext.train', '--experiment=yt8m_demo',
       '--mode=train_and_eval', f'--model_dir={tmp_path / "model"}',
       f'--config_file={config}'],
      capture_output=True, text=True, env=env, timeout=600, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  both = result.stdout + result.stderr
  for line in ('train | step:      1 | steps/sec',
               'train | step:      2 | steps/sec',
               ' eval | step:      2 | eval time',
               f'saved checkpoint to {tmp_path / "model" / "ckpt-2"}.',
               'progress | step 2/2 (100%)'):
    assert both.count(line) == 1, (line, both[-4000:])
  assert 'INFO:tensorflow:' not in both
  assert 'Failed to count model FLOPs' not in both
  assert 'Final experiment parameters' not in both
  assert 'Model FLOPs are not counted here' in both
  # TensorFlow's C++ INFO / WARNING lines are off (TF_CPP_MIN_LOG_LEVEL).
  assert not re.search(r'^\S+ \S+: [IW] tensorflow/', both, re.MULTILINE)
  # The final metrics table ends the output.
  tail = result.stdout.rstrip().splitlines()
  table = tail.index(next(l for l in tail if l.startswith('Final metrics')))
  assert re.match(r'\s+gap\s+\d\.\d{4}$', tail[table + 1])
  assert all(re.match(r'\s+\w+\s+-?\d+\.\d{4}$', l) for l in tail[table + 1:])
