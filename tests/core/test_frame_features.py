"""official_ext.core.frame_features: a stored PCA that cannot be right is
refused when it is read, naming the file and what is wrong."""
import numpy as np
import pytest

from official_ext.core import frame_features


def _fitted():
  rng = np.random.default_rng(0)
  return frame_features.fit_pca(rng.normal(size=[20, 4]), 2)


def _stored(tmp_path, name, **changes):
  pca = _fitted()
  arrays = dict(dict(mean=pca.mean, components=pca.components,
                     eigenvalues=pca.eigenvalues), **changes)
  path = str(tmp_path / f'{name}.pca.npz')
  np.savez(path, **arrays)
  return path


def test_a_saved_pca_loads_unchanged(tmp_path):
  pca = _fitted()
  path = str(tmp_path / 'good.pca.npz')
  pca.save(path)
  loaded = frame_features.load_pca(path)
  for name in ('mean', 'components', 'eigenvalues'):
    np.testing.assert_array_equal(getattr(loaded, name), getattr(pca, name))


@pytest.mark.parametrize('name, changes, message', [
    ('nan_mean', dict(mean=np.array([0., np.nan, 0., 0.], np.float32)),
     r'mean holds 1 NaN or infinite value\(s\) \(first at \[1\]\)'),
    ('inf_components', dict(components=np.full([2, 4], np.inf, np.float32)),
     r'components holds 8 NaN or infinite value\(s\) \(first at \[0, 0\]\)'),
    ('nan_eigenvalues', dict(eigenvalues=np.array([1., np.nan], np.float32)),
     r'eigenvalues holds 1 NaN or infinite value\(s\) \(first at \[1\]\)'),
    ('negative', dict(eigenvalues=np.array([1., -0.5], np.float32)),
     r'eigenvalues hold 1 negative value\(s\) \(-0\.5 at \[1\]\); '
     'they are variances'),
    ('no_components', dict(components=np.zeros([0, 4], np.float32),
                           eigenvalues=np.zeros([0], np.float32)),
     r'no components'),
    ('wrong_width', dict(mean=np.zeros([3], np.float32)),
     r'inconsistent shapes: mean \(3,\), components \(2, 4\)'),
])
def test_a_pca_that_cannot_be_right_is_refused(tmp_path, name, changes,
                                               message):
  path = _stored(tmp_path, name, **changes)
  with pytest.raises(ValueError, match=f'--pca_file={path}: {message}'):
    frame_features.load_pca(path)
