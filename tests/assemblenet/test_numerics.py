"""AssembleNet++lite layers against small numpy implementations.

Self and peer attention in `PeerAttentionFusion`, and the TV-L1 iteration of
`RepresentationFlow`, computed here from their definitions (the layers'
docstrings and the representation-flow paper's scheme) in numpy, with every
weight set to random values so that no term is near its initial identity.
"""
import numpy as np
import pytest
import tensorflow as tf, tf_keras  # pylint: disable=unused-import

from official_ext.assemblenet.modeling import fusion
from official_ext.assemblenet.modeling import representation_flow


def _sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def _softmax(x):
  e = np.exp(x - np.max(x))
  return e / e.sum()


def _randomize(layer, rng):
  """Every variable of `layer` to N(0, 0.5) (edge weights stay as given)."""
  values = {}
  for v in layer.weights:
    if 'agg_weights' in v.name:
      values[v.name] = v.numpy()
      continue
    value = rng.normal(0.0, 0.5, v.shape).astype(np.float32)
    v.assign(value)
    values[v.name] = value
  return values


def _weight(values, suffix):
  matches = [k for k in values if k.endswith(suffix)]
  assert len(matches) == 1, (suffix, sorted(values))
  return values[matches[0]]


def _max_pool_2x2(x):
  """[B, T, H, W, C] -> [B, T, H/2, W/2, C] (even H, W: 'SAME' = 'VALID')."""
  b, t, h, w, c = x.shape
  return x.reshape(b, t, h // 2, 2, w // 2, 2, c).max(axis=(3, 5))


def _fusion_inputs(rng):
  b, t = 2, 3
  x0 = rng.normal(size=(b, t, 4, 4, 4)).astype(np.float32)
  x1 = rng.normal(size=(b, t, 8, 8, 4)).astype(np.float32)   # Pooled by 2.
  x2 = rng.normal(size=(b, t, 4, 4, 6)).astype(np.float32)   # Width 6.
  peers = [rng.normal(size=(b, t, 4, 4, 5)).astype(np.float32),
           rng.normal(size=(b, t, 2, 2, 3)).astype(np.float32)]
  return [x0, x1, x2], peers


@pytest.mark.parametrize('mode', ['self', 'peer'])
def test_attention_fusion_matches_numpy(mode):
  rng = np.random.default_rng(0)
  xs, peers = _fusion_inputs(rng)
  edges = [0.2, 0.5, 0.9]
  layer = fusion.PeerAttentionFusion(3, mode, edges, name='fusion')
  inputs = xs + (peers if mode == 'peer' else [])
  layer([tf.constant(v) for v in inputs])  # Build.
  values = _randomize(layer, rng)
  got = layer([tf.constant(v) for v in inputs], training=False).numpy()

  pooled = [xs[0], _max_pool_2x2(xs[1]), xs[2]]
  if mode == 'peer':
    candidates = [
        p.mean(axis=(2, 3)) @ _weight(values, f'peer_dense_{k}/kernel:0') +
        _weight(values, f'peer_dense_{k}/bias:0')
        for k, p in enumerate(peers)]                     # [B, T, 5] each.
  attended = []
  for i, x in enumerate(pooled):
    x = edges[i] * x          # sigmoid(logit(e)) = e.
    if mode == 'peer':
      mix = _softmax(_weight(values, f'attention_{i}_peer_weights:0'))
      vec = sum(m * c for m, c in zip(mix, candidates))
    else:
      vec = x.mean(axis=(2, 3))                           # [B, T, C_i].
    attn = _sigmoid(vec @ _weight(values, f'attention_{i}/kernel:0') +
                    _weight(values, f'attention_{i}/bias:0'))
    attended.append(x * attn[:, :, None, None, :])
  # Width 6: the two 4-channel inputs are summed, then projected (1x1x1).
  project = _weight(values, 'project_4/kernel:0')[0, 0, 0]  # [4, 6].
  expected = (attended[0] + attended[1]) @ project + attended[2]
  assert layer.fusion_width == 6
  np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def _shift(x, dy, dx):
  """y[i, j] = x[i + dy, j + dx], zero outside (x: [N, H, W])."""
  out = np.zeros_like(x)
  h, w = x.shape[1:]
  ys = slice(max(0, -dy), min(h, h - dy))
  xs = slice(max(0, -dx), min(w, w - dx))
  yt = slice(max(0, dy), min(h, h + dy))
  xt = slice(max(0, dx), min(w, w + dx))
  out[:, ys, xs] = x[:, yt, xt]
  return out


def _tv_l1(clip, num_iter, theta=0.3, lam=0.15, tau=0.25):
  """The representation-flow TV-L1 iteration on one clip [T, H, W, 3]."""
  grey = clip.mean(axis=-1)
  lo, hi = grey.min(), grey.max()
  grey = (grey - lo) * (255.0 / (hi - lo))
  img1, img2 = grey[:-1], grey[1:]                       # [T-1, H, W].
  # Image gradient: central difference (taps -0.5, 0, 0.5), zero outside.
  gx = 0.5 * (_shift(img2, 0, 1) - _shift(img2, 0, -1))
  gy = 0.5 * (_shift(img2, 1, 0) - _shift(img2, -1, 0))
  fwd_x = lambda u: _shift(u, 0, 1) - u                  # Taps -1, 1.
  fwd_y = lambda u: _shift(u, 1, 0) - u

  def div(p1, p2):
    return _backward_diff(p1, axis=2) + _backward_diff(p2, axis=1)

  grad = gx ** 2 + gy ** 2 + 1e-12
  l_t, taut = lam * theta, tau / theta
  u1 = np.zeros_like(img1)
  u2 = np.zeros_like(img1)
  p11 = np.zeros_like(img1)
  p12, p21, p22 = p11.copy(), p11.copy(), p11.copy()
  for _ in range(num_iter):
    rho = img2 - img1 + gx * u1 + gy * u2 + 1e-12
    step = np.where(rho < -l_t * grad, l_t,
                    np.where(rho > l_t * grad, -l_t, 0.0))
    middle = (np.abs(rho) <= l_t * grad) & (grad > 1e-12)
    step = np.where(middle, -rho / grad, step)
    u1 = step * gx + u1 + theta * div(p11, p12)
    u2 = step * gy + u2 + theta * div(p21, p22)
    u1x, u1y, u2x, u2y = fwd_x(u1), fwd_y(u1), fwd_x(u2), fwd_y(u2)
    n1 = 1.0 + taut * np.sqrt(u1x ** 2 + u1y ** 2 + 1e-12)
    n2 = 1.0 + taut * np.sqrt(u2x ** 2 + u2y ** 2 + 1e-12)
    p11, p12 = (p11 + taut * u1x) / n1, (p12 + taut * u1y) / n1
    p21, p22 = (p21 + taut * u2x) / n2, (p22 + taut * u2y) / n2
  flow = np.stack([u1, u2], axis=-1)                     # [T-1, H, W, 2].
  return np.concatenate([flow, flow[-1:]], axis=0)


def _backward_diff(p, axis):
  """The divergence term along `axis`: p[i] - p[i-1] (p[-1] = 0), and at the
  last index -p[n-2] (the layer shifts p by one, then takes the forward
  difference with a zero past the end)."""
  q = np.moveaxis(p, axis, -1)
  out = q.copy()
  out[..., 1:] -= q[..., :-1]
  out[..., -1] = -q[..., -2]
  return np.moveaxis(out, -1, axis)


def test_rep_flow_matches_numpy_tv_l1():
  rng = np.random.default_rng(1)
  # Smooth random frames (a blurred random field) moving over 3 frames.
  base = rng.uniform(0, 255, (12, 12, 3))
  base = (base + np.roll(base, 1, 0) + np.roll(base, 1, 1)) / 3.0
  clip = np.stack([np.roll(base, s, axis=1) for s in range(3)])[:, 2:10, 2:10]
  clips = np.stack([clip, clip[:, ::-1]]).astype(np.float32)  # Two clips.
  layer = representation_flow.RepresentationFlow(num_iter=4)
  got = layer(tf.constant(clips)).numpy()
  for b in range(2):
    expected = _tv_l1(clips[b].astype(np.float64), num_iter=4)
    np.testing.assert_allclose(got[b], expected, rtol=1e-3, atol=2e-3)
  assert np.abs(got).max() > 0.05  # The flow is not trivially zero.
