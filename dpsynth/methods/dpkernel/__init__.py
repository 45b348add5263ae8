"""DP-Kernel: a generator trained on the privatised gradient field of a kernel mean embedding.

The `Method` lives in `method.py`, its trainer in `trainer.py`, the network in `nets.py`, the
sampler in `generator.py`, the kernel terms in `kernel.py`, the generated labels in
`labels.py` and the presets in `presets.py`; this package re-exports their public names so that
`from dpsynth.methods.dpkernel import DPKernelMethod` keeps working.
"""

from dpsynth.methods.dpkernel.generator import DPKernelGenerator
from dpsynth.methods.dpkernel.kernel import generated_kernel_mean, raw_embedding_gradient
from dpsynth.methods.dpkernel.labels import balanced_labels, weighted_labels
from dpsynth.methods.dpkernel.method import DPKernelMethod
from dpsynth.methods.dpkernel.nets import LabelledConvDecoder, VectorGenerator
from dpsynth.methods.dpkernel.presets import PRESETS, TABLE_PRESETS, WARM_START_DEFAULTS
from dpsynth.methods.dpkernel.trainer import DPKernelTrainer

__all__ = [
    "PRESETS",
    "TABLE_PRESETS",
    "WARM_START_DEFAULTS",
    "DPKernelGenerator",
    "DPKernelMethod",
    "DPKernelTrainer",
    "LabelledConvDecoder",
    "VectorGenerator",
    "balanced_labels",
    "generated_kernel_mean",
    "raw_embedding_gradient",
    "weighted_labels",
]
