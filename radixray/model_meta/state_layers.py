"""The geometry of recurrent-state layers (hybrid models, docs/models.md): what each kind of
state layer computes from, and the shape of the state a sequence carries through it.

Two kinds beside attention (``ModelConfig.layer_kinds``):

- ``"conv"``: LFM2's gated short convolution (:class:`ShortConvSpec`). Its state is the last
  ``kernel - 1`` inputs of the depthwise convolution, ``[hidden, kernel - 1]``: the next token's
  output reads exactly those (transformers' cache keeps ``kernel`` of them; the oldest is never
  read again).
- ``"mamba"``: Mamba2's mixer (:class:`Mamba2Spec`, Granite 4.0-H). Two states: the causal
  conv1d's last ``conv_kernel - 1`` inputs over its ``conv_dim`` channels, and the SSM state
  ``[num_heads, head_dim, state_size]``.

Torch-free: the router and the simulator read state sizes from here too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["LAYER_KINDS", "Mamba2Spec", "ShortConvSpec"]

LAYER_KINDS = ("attention", "conv", "mamba")


def _positive(owner: str, **values: int) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{owner}.{name} must be a positive int, got {value!r}")


@dataclass(frozen=True)
class ShortConvSpec:
    """LFM2's gated short convolution over ``hidden`` channels::

        B, C, x = in_proj(h)            each [T, hidden]
        y = C * conv(B * x)             depthwise causal conv, kernel ``kernel``, no activation
        out = out_proj(y)

    ``bias``: in_proj, the convolution and out_proj all have biases (``conv_bias``)."""

    kernel: int
    bias: bool = False

    def __post_init__(self) -> None:
        _positive("ShortConvSpec", kernel=self.kernel)
        if self.kernel < 2:
            raise ValueError(f"ShortConvSpec.kernel must be >= 2, got {self.kernel}")

    def state_shape(self, hidden_size: int) -> tuple[int, int]:
        """One sequence's conv state: ``[hidden, kernel - 1]``."""
        return (hidden_size, self.kernel - 1)


@dataclass(frozen=True)
class Mamba2Spec:
    """Mamba2's mixer as transformers' GraniteMoeHybrid runs it::

        z, xBC, dt = in_proj(h)         [inner], [conv_dim], [num_heads]
        xBC = silu(conv1d(xBC))         depthwise causal, kernel ``conv_kernel``
        x, B, C = xBC                   [heads, head_dim], [n_groups, state_size] twice
        dt = clamp(softplus(dt + dt_bias), dt_min, dt_max);  A = -exp(A_log)
        y = SSD(x, dt, A, B, C) + D * x            (kernels/state_reference.py)
        out = out_proj(gated_rms_norm(y, z))       norm of y * silu(z), per group of channels

    Query heads ``h`` read B/C group ``h // (num_heads // n_groups)``."""

    num_heads: int
    head_dim: int
    state_size: int
    n_groups: int = 1
    conv_kernel: int = 4
    conv_bias: bool = True
    proj_bias: bool = False
    chunk_size: int = 256
    dt_min: float = 0.0
    dt_max: float = math.inf

    def __post_init__(self) -> None:
        _positive(
            "Mamba2Spec",
            num_heads=self.num_heads,
            head_dim=self.head_dim,
            state_size=self.state_size,
            n_groups=self.n_groups,
            conv_kernel=self.conv_kernel,
            chunk_size=self.chunk_size,
        )
        if self.conv_kernel < 2:
            raise ValueError(f"Mamba2Spec.conv_kernel must be >= 2, got {self.conv_kernel}")
        if self.num_heads % self.n_groups:
            raise ValueError(
                f"Mamba2Spec.num_heads ({self.num_heads}) must be a multiple of n_groups "
                f"({self.n_groups})"
            )
        if not 0.0 <= self.dt_min <= self.dt_max:
            raise ValueError(
                f"Mamba2Spec: time step limits must satisfy 0 <= dt_min <= dt_max, got "
                f"({self.dt_min}, {self.dt_max})"
            )

    @property
    def inner(self) -> int:
        """Channels of x, z and y: ``num_heads * head_dim``."""
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        """Channels the conv1d runs over: x, B and C together."""
        return self.inner + 2 * self.n_groups * self.state_size

    @property
    def in_proj_size(self) -> int:
        """Width of in_proj's output: z, xBC, dt."""
        return self.inner + self.conv_dim + self.num_heads

    def conv_state_shape(self) -> tuple[int, int]:
        """One sequence's conv state: ``[conv_dim, conv_kernel - 1]``."""
        return (self.conv_dim, self.conv_kernel - 1)

    def ssm_state_shape(self) -> tuple[int, int, int]:
        """One sequence's SSM state: ``[num_heads, head_dim, state_size]``."""
        return (self.num_heads, self.head_dim, self.state_size)
