"""YouTube-8M's frame-feature format: quantization, whitened PCA, records."""
import dataclasses
import io
from typing import Mapping, Sequence

import numpy as np
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official_ext.core import output_files

MAX_QUANTIZED_VALUE = 2.0
MIN_QUANTIZED_VALUE = -2.0
QUANTIZATION_SCALE = (MAX_QUANTIZED_VALUE - MIN_QUANTIZED_VALUE) / 255.0
QUANTIZATION_BIAS = ((MAX_QUANTIZED_VALUE - MIN_QUANTIZED_VALUE) / 512.0 +
                     MIN_QUANTIZED_VALUE)
# Added to the eigenvalues before whitening (YouTube-8M's extractor's 1e-4).
PCA_EPSILON = 1e-4


def quantize(x: np.ndarray) -> np.ndarray:
  """Float array -> uint8 of the same shape (clipped to [0, 255])."""
  q = np.rint((np.asarray(x) - QUANTIZATION_BIAS) / QUANTIZATION_SCALE)
  return np.clip(q, 0, 255).astype(np.uint8)


def dequantize(q: np.ndarray) -> np.ndarray:
  """uint8 array -> float32 (the inverse of `quantize` inside [-2, 2])."""
  return (np.asarray(q, np.float32) * np.float32(QUANTIZATION_SCALE) +
          np.float32(QUANTIZATION_BIAS))


@dataclasses.dataclass
class Pca:
  """A fitted PCA with whitening, as YouTube-8M's feature extractor's.

  `mean` [D], `components` [dim, D] (orthonormal rows), `eigenvalues` [dim].
  """
  mean: np.ndarray
  components: np.ndarray
  eigenvalues: np.ndarray

  @property
  def input_dim(self) -> int:
    return int(self.mean.shape[0])

  @property
  def dim(self) -> int:
    return int(self.components.shape[0])

  def apply(self, features: np.ndarray, name: str = 'features') -> np.ndarray:
    """float [N, D] -> float32 [N, dim], whitened; `name` is for errors."""
    features = np.asarray(features, np.float32)
    if features.ndim != 2 or features.shape[1] != self.input_dim:
      raise ValueError(
          f'{name}: {features.shape} features, but the PCA was fitted on '
          f'{self.input_dim}-wide features (expected [N, {self.input_dim}]).')
    projected = (features - self.mean) @ self.components.T
    return (projected / np.sqrt(self.eigenvalues + PCA_EPSILON)).astype(
        np.float32)

  def save(self, path: str) -> None:
    """Writes the .npz file at `path`, whole or not at all."""
    buffer = io.BytesIO()
    np.savez(buffer, mean=self.mean, components=self.components,
             eigenvalues=self.eigenvalues)
    output_files.write_atomically(
        path, lambda out: out.write(buffer.getvalue()), binary=True)


@dataclasses.dataclass
class Moments:
  """Count, mean and scatter of feature vectors, mergeable in any order."""
  count: int
  mean: np.ndarray
  scatter: np.ndarray

  @classmethod
  def of(cls, features: np.ndarray, name: str = 'features') -> 'Moments':
    """Of float [N, D] finite features; ValueError naming `name`."""
    features = np.asarray(features, np.float64)
    if features.ndim != 2 or not features.shape[0]:
      raise ValueError(f'{name}: features must be [N, D] with N >= 1; got '
                       f'{features.shape}.')
    if not np.isfinite(features).all():
      raise ValueError(f'{name}: the features hold NaN or infinite values.')
    mean = features.mean(axis=0)
    centred = features - mean
    return cls(features.shape[0], mean, centred.T @ centred)

  def merge(self, other: 'Moments') -> 'Moments':
    """The moments of both sets; ValueError if their widths differ."""
    if self.mean.shape != other.mean.shape:
      raise ValueError(f'features of width {self.mean.shape[0]} and '
                       f'{other.mean.shape[0]} cannot share a PCA.')
    count = self.count + other.count
    delta = other.mean - self.mean
    mean = self.mean + delta * (other.count / count)
    scatter = (self.scatter + other.scatter +
               np.outer(delta, delta) * (self.count * other.count / count))
    return Moments(count, mean, scatter)


def pca_from_moments(moments: 'Moments', dim: int,
                     flag: str = '--pca_dim') -> Pca:
  """The `dim`-component PCA; ValueError naming `flag` for a bad `dim`."""
  n, d = moments.count, moments.mean.shape[0]
  if not 1 <= dim <= min(d, n - 1):
    raise ValueError(
        f'{flag}={dim}: a PCA fitted on {n} feature vectors of width {d} has '
        f'at most min({d}, {n} - 1) = {max(0, min(d, n - 1))} components; '
        f'choose {flag} in [1, {max(1, min(d, n - 1))}] or fit on more '
        'features.')
  covariance = moments.scatter / (n - 1)
  eigenvalues, vectors = np.linalg.eigh((covariance + covariance.T) / 2)
  order = np.argsort(eigenvalues)[::-1][:dim]
  return Pca(mean=moments.mean.astype(np.float32),
             components=vectors[:, order].T.astype(np.float32),
             eigenvalues=np.maximum(eigenvalues[order], 0.0).astype(
                 np.float32))


def fit_pca(features: np.ndarray, dim: int, flag: str = '--pca_dim') -> Pca:
  """`pca_from_moments` of float [N, D] features."""
  return pca_from_moments(Moments.of(features, 'fit_pca'), dim, flag)


def load_pca(path: str, flag: str = '--pca_file') -> Pca:
  """The PCA `Pca.save` stored at `path`; ValueError naming what is wrong."""
  if not tf.io.gfile.exists(path):
    raise ValueError(f'{flag}={path}: no such file.')
  try:
    with tf.io.gfile.GFile(path, 'rb') as f:
      data = np.load(io.BytesIO(f.read()))
      arrays = {k: np.asarray(data[k], np.float32)
                for k in ('mean', 'components', 'eigenvalues')}
  except (KeyError, ValueError, OSError) as e:
    raise ValueError(f'{flag}={path} is not a PCA file (an .npz with mean, '
                     f'components and eigenvalues): {e}') from e
  pca = Pca(**arrays)
  if (pca.mean.ndim != 1 or pca.components.ndim != 2 or
      pca.components.shape[1] != pca.input_dim or
      pca.eigenvalues.shape != (pca.dim,)):
    raise ValueError(
        f'{flag}={path}: inconsistent shapes: mean {pca.mean.shape}, '
        f'components {pca.components.shape}, eigenvalues '
        f'{pca.eigenvalues.shape} (expected [D], [dim, D], [dim]).')
  if not pca.dim or not pca.input_dim:
    raise ValueError(f'{flag}={path}: no components (components '
                     f'{pca.components.shape}); expected [dim, D], dim >= 1.')
  for name, values in arrays.items():
    bad = np.argwhere(~np.isfinite(values))
    if len(bad):
      raise ValueError(
          f'{flag}={path}: {name} holds {len(bad)} NaN or infinite value(s) '
          f'(first at {bad[0].tolist()}); a PCA of finite features has none.')
  negative = np.flatnonzero(pca.eigenvalues < 0)
  if len(negative):
    raise ValueError(
        f'{flag}={path}: eigenvalues hold {len(negative)} negative value(s) '
        f'({pca.eigenvalues[negative[0]]:g} at [{negative[0]}]); they are '
        'variances, never below 0.')
  return pca


def make_sequence_example(video_id: str, labels: Sequence[int],
                          features: Mapping[str, np.ndarray]
                          ) -> tf.train.SequenceExample:
  """A YouTube-8M frame-level `SequenceExample`.

  `features`: {name: [frames, width]} uint8 (bytes a frame) or float32 (floats a
  frame), one frame count >= 1; ValueError naming a feature that differs.
  """
  example = tf.train.SequenceExample()
  context = example.context.feature
  context['id'].bytes_list.value.append(video_id.encode('utf-8'))
  context['labels'].int64_list.value.extend(int(l) for l in labels)
  frames = None
  for name, values in features.items():
    values = np.asarray(values)
    if values.ndim != 2 or values.dtype not in (np.uint8, np.float32):
      raise ValueError(
          f'video {video_id!r}, feature {name!r}: expected uint8 or float32 '
          f'[frames, width]; got {values.dtype} {values.shape}.')
    if values.dtype == np.float32 and not np.isfinite(values).all():
      raise ValueError(f'video {video_id!r}, feature {name!r}: NaN or '
                       'infinite values.')
    if frames is None:
      frames = values.shape[0]
    if values.shape[0] != frames or not frames:
      raise ValueError(f'video {video_id!r}, feature {name!r}: '
                       f'{values.shape[0]} frames; expected {frames or ">0"}.')
    feature_list = example.feature_lists.feature_list[name]
    for row in values:
      if values.dtype == np.uint8:
        feature_list.feature.add().bytes_list.value.append(row.tobytes())
      else:
        feature_list.feature.add().float_list.value.extend(row.tolist())
  return example
