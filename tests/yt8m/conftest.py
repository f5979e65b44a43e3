"""YT8M fixtures shared by several test modules (paid for once a session)."""
import pytest
import tf_keras

from official.core import exp_factory
from official_ext import registry_imports  # pylint: disable=unused-import
from official_ext import train
from tests.yt8m.test_train import _tiny_overrides

NUM_VALIDATION = 20


def eval_params(cache_dir):
  """The tiny yt8m_demo config of the evaluation tests: 20 validation videos
  (about a third of them with segment ratings), batches of 8."""
  overrides = _tiny_overrides(cache_dir, train_steps=1)
  overrides['task']['validation_data']['drop_remainder'] = False
  overrides['task']['demo_data'].update(
      num_train_videos=16, num_validation_videos=NUM_VALIDATION)
  overrides['trainer'].update(steps_per_loop=1, checkpoint_interval=1,
                              summary_interval=1, validation_interval=1)
  params = exp_factory.get_exp_config('yt8m_demo')
  params.override(overrides, is_strict=True)
  params.validate()
  return params


@pytest.fixture(scope='session')
def yt8m_eval_checkpoint(tmp_path_factory):
  """(params, model_dir): `eval_params` trained one step, checkpointed.

  Evaluations write their summaries into model_dir/validation."""
  root = tmp_path_factory.mktemp('yt8m_eval')
  params = eval_params(root / 'cache')
  tf_keras.utils.set_random_seed(3)
  train.run(params, 'train', str(root / 'model'))
  return params, str(root / 'model')
