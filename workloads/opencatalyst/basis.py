"""The radial and spherical bases of DimeNet++, in plain PyTorch (autograd through distances).

Source: Gasteiger et al., "Directional Message Passing for Molecular Graphs" (DimeNet,
arXiv:2003.03123, section 4 and appendix) and the layers the OCP reference
(mlcommons/hpc ``open_catalyst/ocpmodels/models/dimenet_plus_plus.py``) imports from
torch-geometric's ``nn/models/dimenet.py`` (``Envelope``, ``BesselBasisLayer``,
``SphericalBasisLayer``) and ``dimenet_utils.py`` (``Jn_zeros``, ``bessel_basis``,
``real_sph_harm``). torch-geometric builds its functions with sympy; here the zeros and normalisers
come from scipy and the functions are evaluated in torch:

- spherical Bessel functions j_l by the closed forms' upward recurrence where it is accurate and
  by their power series near zero, where the recurrence (and the reference's expanded sympy
  forms) lose digits to cancellation;
- Legendre polynomials P_l by Bonnet's recurrence; Y_l^0 = sqrt((2l + 1) / (4 pi)) P_l(cos).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy import optimize, special
from torch import nn

SERIES_TERMS = 14  # terms of the j_l power series; below 1e-16 relative for x < 0.5 + l / 2


def bessel_zeros(num_spherical: int, num_radial: int) -> np.ndarray:
    """The first ``num_radial`` positive zeros z_ln of j_l for l < ``num_spherical``.

    Found as torch-geometric's ``Jn_zeros`` finds them: the zeros of j_l interlace those of
    j_{l-1}, so each lies between two consecutive zeros of the order below (Brent's method); the
    result is rounded to float32, as the reference stores it.

    Returns:
        float64 array ``(num_spherical, num_radial)``; row 0 is ``n pi``.
    """
    count = num_radial + num_spherical - 1
    points = np.arange(1, count + 1) * np.pi
    zeros = np.zeros((num_spherical, num_radial))
    zeros[0] = points[:num_radial]
    for order in range(1, num_spherical):
        roots = [optimize.brentq(lambda x, n=order: special.spherical_jn(n, x),
                                 points[k], points[k + 1], xtol=1e-15)
                 for k in range(count - order)]
        points = np.asarray(roots)
        zeros[order] = points[:num_radial]
    return zeros.astype(np.float32).astype(np.float64)


def bessel_normalisers(zeros: np.ndarray) -> np.ndarray:
    """DimeNet's normalisers N_ln = 1 / sqrt(j_{l+1}(z_ln)^2 / 2) (``bessel_basis``), which make
    N_ln j_l(z_ln x) orthonormal on [0, 1] with weight x^2.

    Args:
        zeros: ``(L, R)`` from `bessel_zeros`.

    Returns:
        float64 array of the same shape.
    """
    orders = np.arange(zeros.shape[0])[:, None] + 1
    return 1.0 / np.sqrt(0.5 * special.spherical_jn(orders, zeros) ** 2)


def _jn_series(order: int, x: torch.Tensor) -> torch.Tensor:
    """j_l(x) = x^l / (2l+1)!! * sum_k (-x^2/2)^k / (k! (2l+3)(2l+5)...(2l+2k+1))."""
    term = torch.ones_like(x)
    total = torch.ones_like(x)
    half_sq = -0.5 * x * x
    for k in range(1, SERIES_TERMS):
        term = term * half_sq / (k * (2 * order + 2 * k + 1))
        total = total + term
    double_factorial = float(np.prod(np.arange(1, 2 * order + 2, 2)))
    return x.pow(order) * total / double_factorial


def _jn_upward(order: int, x: torch.Tensor) -> torch.Tensor:
    """j_l(x) from j_0 = sin x / x, j_1 = sin x / x^2 - cos x / x and
    j_{l+1} = (2l + 1) / x j_l - j_{l-1}; accurate for x above `spherical_jn`'s switch."""
    sin, cos = torch.sin(x), torch.cos(x)
    previous, current = sin / x, sin / (x * x) - cos / x
    for n in range(1, order):
        previous, current = current, (2 * n + 1) / x * current - previous
    return current


def spherical_jn(order: int, x: torch.Tensor) -> torch.Tensor:
    """The spherical Bessel function of the first kind j_l(x), differentiable.

    Upward recurrence for x >= 0.5 + l / 2 and the power series below, so that float32 keeps
    about six significant digits for every x >= 0 and l <= 10 (checked against
    ``scipy.special.spherical_jn`` in tests/test_oc20_model.py).

    Args:
        order: l >= 0.
        x: any shape, float32 or float64, x >= 0.

    Returns:
        j_l(x), same shape and dtype.

    Raises:
        ValueError: ``order`` negative.
    """
    if order < 0:
        raise ValueError(f"spherical_jn: order must be >= 0, got {order}")
    if order == 0:
        return torch.sinc(x / math.pi)
    switch = 0.5 + 0.5 * order
    small = x < switch
    series = _jn_series(order, torch.where(small, x, torch.zeros_like(x)))
    upward = _jn_upward(order, torch.where(small, torch.full_like(x, switch), x))
    return torch.where(small, series, upward)


def legendre(order: int, x: torch.Tensor) -> torch.Tensor:
    """Legendre polynomial P_l(x) by Bonnet's recurrence (l P_l = (2l-1) x P_{l-1} - (l-1) P_{l-2}).

    Args:
        order: l >= 0.
        x: any shape, float.

    Returns:
        P_l(x), same shape and dtype.
    """
    previous, current = torch.ones_like(x), x
    if order == 0:
        return previous
    for n in range(2, order + 1):
        previous, current = current, ((2 * n - 1) * x * current - (n - 1) * previous) / n
    return current


class Envelope(nn.Module):
    """DimeNet's smooth cutoff u(x) = 1/x + a x^(p-1) + b x^p + c x^(p+1) with p = exponent + 1,
    a = -(p+1)(p+2)/2, b = p(p+2), c = -p(p+1)/2 (DimeNet eq. 8), zero for x >= 1.

    The factor ``(x < 1)`` is torch-geometric 2.x's; the 1.x layer the reference ran had none, which
    changes nothing on edges within the cutoff (u(1) = 0) and only silences edges beyond it.

    Args:
        exponent: the reference's ``envelope_exponent`` (5).
    """

    def __init__(self, exponent: int) -> None:
        super().__init__()
        self.p = exponent + 1
        self.a = -(self.p + 1) * (self.p + 2) / 2
        self.b = self.p * (self.p + 2)
        self.c = -self.p * (self.p + 1) / 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: distance / cutoff, any shape, > 0. Returns u(x), same shape."""
        x_p0 = x.pow(self.p - 1)
        x_p1 = x_p0 * x
        polynomial = 1.0 / x + self.a * x_p0 + self.b * x_p1 + self.c * x_p1 * x
        return polynomial * (x < 1.0).to(x.dtype)


class BesselBasisLayer(nn.Module):
    """Radial basis e_n(d) = u(d/c) sin(f_n d/c), n = 1..R, with learnable frequencies f_n
    initialised to n pi (DimeNet eq. 7 without its sqrt(2/c) factor, as torch-geometric).

    Args:
        num_radial: R (6 in the reference).
        cutoff: c, Angstrom.
        envelope_exponent: see `Envelope`.
    """

    def __init__(self, num_radial: int, cutoff: float, envelope_exponent: int) -> None:
        super().__init__()
        self.cutoff = float(cutoff)
        self.envelope = Envelope(envelope_exponent)
        self.freq = nn.Parameter(torch.empty(num_radial))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Frequencies back to ``n pi``."""
        with torch.no_grad():
            self.freq.copy_(torch.arange(1, self.freq.numel() + 1, dtype=self.freq.dtype) * math.pi)

    def forward(self, dist: torch.Tensor) -> torch.Tensor:
        """``dist``: (E,) Angstrom, > 0. Returns (E, R), the dtype of ``dist``."""
        x = dist.unsqueeze(-1) / self.cutoff
        return self.envelope(x) * torch.sin(self.freq * x)


class SphericalBasisLayer(nn.Module):
    """2-D basis a_ln(d, angle) = u(d/c) N_ln j_l(z_ln d/c) Y_l^0(angle) of DimeNet eq. 9
    (torch-geometric's ``SphericalBasisLayer``), l < L = ``num_spherical``, n < R = ``num_radial``,
    d the length of edge kj and angle the triplet's angle.

    No parameters: the zeros z_ln and normalisers N_ln are buffers, so ``.double()`` moves them.

    Args:
        num_spherical: L (7 in the reference).
        num_radial: R (6).
        cutoff: c, Angstrom.
        envelope_exponent: see `Envelope`.
    """

    def __init__(self, num_spherical: int, num_radial: int, cutoff: float,
                 envelope_exponent: int) -> None:
        super().__init__()
        self.num_spherical, self.num_radial = num_spherical, num_radial
        self.cutoff = float(cutoff)
        self.envelope = Envelope(envelope_exponent)
        zeros = bessel_zeros(num_spherical, num_radial)
        self.register_buffer("zeros", torch.tensor(zeros, dtype=torch.float32), persistent=False)
        self.register_buffer("normalisers", torch.tensor(bessel_normalisers(zeros), dtype=torch.float32),
                             persistent=False)

    def radial(self, dist: torch.Tensor) -> torch.Tensor:
        """u(d/c) N_ln j_l(z_ln d/c): ``dist`` (E,) Angstrom -> (E, L, R)."""
        x = (dist / self.cutoff).unsqueeze(-1)
        rows = [spherical_jn(order, x * self.zeros[order]) for order in range(self.num_spherical)]
        return torch.stack(rows, dim=1) * self.normalisers * self.envelope(x).unsqueeze(-1)

    def angular(self, angle: torch.Tensor) -> torch.Tensor:
        """Y_l^0(angle) = sqrt((2l+1)/(4 pi)) P_l(cos angle): ``angle`` (T,) radians -> (T, L)."""
        cos = torch.cos(angle)
        rows = [math.sqrt((2 * order + 1) / (4 * math.pi)) * legendre(order, cos)
                for order in range(self.num_spherical)]
        return torch.stack(rows, dim=1)

    def forward(self, dist: torch.Tensor, angle: torch.Tensor, idx_kj: torch.Tensor) -> torch.Tensor:
        """``dist`` (E,) Angstrom, ``angle`` (T,) radians, ``idx_kj`` int64 (T,) edge kj of each
        triplet. Returns (T, L * R), index ``l * R + n``, the dtype of ``dist``."""
        radial = self.radial(dist)[idx_kj]
        angular = self.angular(angle).unsqueeze(-1)
        return (radial * angular).reshape(-1, self.num_spherical * self.num_radial)
