"""official_ext: YouTube-8M, AssembleNet and multitask readout on Model Garden."""
import os
import sys

# A command of this package (`python -m official_ext.…`, during which
# sys.argv[0] is '-m') gets tf_keras as `tf.keras` without importing Keras 3,
# unless the user chose otherwise or TensorFlow is already imported.
if sys.argv[:1] == ['-m'] and 'tensorflow' not in sys.modules:
  os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')
