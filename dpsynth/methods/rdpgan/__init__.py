"""RDP-GAN (Ma et al., arXiv 2007.02056) in the sound mode of spec `rdpgan.md` §4.3."""

from dpsynth.methods.rdpgan.method import RDPGANMethod

__all__ = ["RDPGANMethod"]
