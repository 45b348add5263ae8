"""The PRV accountant's domain and mesh: how wide the privacy-loss domain must be, how many
nodes its mesh has, and an ε error that gives the FFT a fast length.

`privacy.accounting` asks these before any array is allocated, so that a composition whose
mesh would not fit in time and memory is refused (and the RDP bound reported) up front.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from dpsynth.privacy.accounting import prv, rdp


def safe_domain_length(keys: Sequence[tuple], counts: Sequence[int], delta_error: float) -> float:
    """Half-width of the PRV domain, as prv-accountant's `compute_safe_domain_size`.

    Same rule (Gopi et al. 2021, remark 5.6) with integer RDP orders, which bound the tails just
    as validly and are much faster to evaluate. The ε error is added by the caller.
    """
    length = rdp.rdp_epsilon(keys, counts, delta_error / 4.0, rdp.INTEGER_ORDERS)
    total = sum(counts)
    for key in keys:
        length = max(
            length, rdp.rdp_epsilon([key], [1], delta_error / 8.0 / total, rdp.INTEGER_ORDERS)
        )
    return length


def _is_fft_friendly(size: int) -> bool:
    """True when `size` has no prime factor above 7 (pocketfft is fast on such lengths)."""
    for prime in (2, 3, 5, 7):
        while size % prime == 0:
            size //= prime
    return size == 1


def fft_friendly_eps_error(
    length: float, counts: Sequence[int], delta_error: float, eps_error: float
) -> float:
    """An ε error ≤ `eps_error` whose PRV mesh has an FFT-friendly number of nodes.

    The accountant's mesh follows from the ε error and the number of compositions; a length
    with a large prime factor makes its long-double FFT some 20x slower. A slightly smaller ε
    error (a slightly finer mesh, so a tighter bound) that lands on a smooth length costs nothing
    in rigour.
    """
    spread = math.sqrt(sum(counts) / 2.0 * math.log(12.0 / delta_error))
    size = prv.aligned_size(-length, length, eps_error / spread)
    for target in range(size, 2 * size + 16):
        if target % 2 or not _is_fft_friendly(target):
            continue
        candidate = 2.0 * length / (target - 3)
        for _ in range(4):
            got = prv.aligned_size(-length, length, candidate)
            if got == target:
                error = candidate * spread
                check = prv.aligned_size(-length, length, error / spread)
                if check == target and error <= eps_error:
                    return error
                break
            candidate *= (got - 1) / (target - 1)
    return eps_error


def prv_mesh_size(
    length: float, counts: Sequence[int], delta_error: float, eps_error: float
) -> float:
    """The number of nodes of the PRV accountant's mesh over [-length, length].

    The accountant's mesh width is its ε error divided by the spread of the composed privacy
    loss, √(T/2 · log(12/δ_error)) (as `Domain.create_aligned` is called in prv-accountant).
    """
    spread = math.sqrt(sum(counts) / 2.0 * math.log(12.0 / delta_error))
    return 2.0 * length * spread / eps_error
