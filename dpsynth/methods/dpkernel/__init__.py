"""DP-Kernel: a generator trained on the privatised gradient field of a kernel mean embedding.

The backend lives in `method.py`; this package re-exports its public names so that
`from dpsynth.methods.dpkernel import DPKernelMethod` keeps working.
"""

# A star re-export (not a list) so that public names added to method.py are exported too.
from dpsynth.methods.dpkernel.method import *  # noqa: F403
