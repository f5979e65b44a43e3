"""The joint model (`model`); its public names are re-exported here."""
from official_ext.joint.modeling.model import add_kernel_l2
from official_ext.joint.modeling.model import build_yt8m_head
from official_ext.joint.modeling.model import JointModel
from official_ext.joint.modeling.model import regularization_losses
from official_ext.joint.modeling.model import YT8MTokenModel
