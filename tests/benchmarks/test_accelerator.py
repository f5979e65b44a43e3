"""`python -m official_ext.benchmark accelerator`: refuses without an
accelerator; its harness, driven on the logical CPUs at tiny sizes, times
each shipped GPU YAML's step under the stock and the fast kernel policy."""
import pytest
import tensorflow as tf

from official_ext import benchmark
from official_ext.benchmarks import accelerator
from tests import cli


def test_without_an_accelerator_it_says_so_and_exits_non_zero(tmp_path):
  json_path = tmp_path / 'accelerator.json'
  with pytest.raises(SystemExit) as exit_info:
    cli.run_main(benchmark, 'accelerator', f'--json={json_path}')
  message = str(exit_info.value.code)
  assert 'No GPU or TPU is visible to this process' in message, message
  assert 'TensorFlow sees: CPU' in message
  assert not json_path.exists()


def test_harness_times_stock_and_fast_steps():
  """The DBoF case on two logical CPUs, under the stock and the fast
  policy (the same code a GPU runs, but for the devices)."""
  figures = accelerator.run(quick=True, steps=2, warmup=1, device='CPU',
                            cases=['yt8m_dbof'])
  assert set(figures) == {'device', 'yt8m_dbof'}
  f = figures['yt8m_dbof']
  assert f['yaml'] == 'configs/yt8m/yt8m_gpu.yaml'
  assert f['precision'] == 'float16' and f['replicas'] == 2
  assert f['global_batch'] == 4 and f['examples_per_sec'] > 0
  assert f['gflops_per_example'] > 0 and f['achieved_tflops'] > 0
  assert f['kernel_policy']['setting'] == 'auto'
  assert f['fast_kernel_policy']['setting'] == 'fast'
  assert f['fast_kernel_policy']['fast_paths']
  assert f['fast_vs_stock'] > 0
  row = accelerator.table(figures).splitlines()[2]
  assert row.startswith('| yt8m_dbof') and 'float16' in row


@pytest.mark.parametrize('case', accelerator.CASES, ids=lambda c: c.name)
def test_every_case_builds_its_batch_and_flops(case):
  """Each case's YAML and per-replica batch at the published size (no step
  is run): the batch has the experiment's shapes; its training step's FLOPs
  are counted from the traced step at the quick sizes (the published-size
  counts: tests/benchmarks/test_graph_flops.py and
  tests/assemblenet/test_modeling.py)."""
  from official.core import task_factory  # pylint: disable=g-import-not-at-top
  params = accelerator._params(case, 'CPU', quick=False, tpu='')  # pylint: disable=protected-access
  assert params.task.train_data.global_batch_size > 0
  task = task_factory.get_task(params.task)
  per_replica = 2
  batch = accelerator._batch(task, params, per_replica)  # pylint: disable=protected-access
  examples = {'yt8m': lambda b: b['video_matrix'],
              'assemblenet': lambda b: b[0]['image'],
              'readout': lambda b: b['input_values']}[case.family](batch)
  assert examples.shape[0] == per_replica, examples.shape
  if case.family == 'assemblenet':
    # Object maps exactly for an experiment with an object stem: int32
    # class ids at the clip's size.
    k = params.task.train_data.num_object_classes
    assert ('objects' in batch[0]) == bool(k) == (
        case.name == 'assemblenet_plus_charades')
    if k:
      objects = batch[0]['objects']
      assert objects.dtype == tf.int32
      assert objects.shape == examples.shape[:-1]
      assert 0 <= int(tf.reduce_min(objects)) and int(
          tf.reduce_max(objects)) < k == 151
  quick = accelerator._params(case, 'CPU', quick=True, tpu='')  # pylint: disable=protected-access
  if case.family == 'readout':
    # Chained (varlen) queries: a routed batch of no static shape, which
    # the counter names (the run then reports no FLOPs).
    with pytest.raises(ValueError, match='unknown shape'):
      accelerator.flops_per_example(quick)
  else:
    assert accelerator.flops_per_example(quick) > 0
