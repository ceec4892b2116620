"""How the runtime runs a network it loads, as one object handed to the loaders: which product kernels the load-time
timing may pick, whether attention over the KV cache and the target's whole pass run natively, whether passes are
compiled. Stages build it from the config (validate.compile), benchmark scripts from their flags
(`bench.runtime_settings`); nothing rebinds a module's globals to change what runs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

# the product kernels the load-time timing may pick among (runtime/kernels.py implements them): F.linear, the
# transposed product, BLAS over c column blocks, the native few-row kernel, its 16-lane form, over packed panels
BLOCKS = (2, 4, 8)
KERNELS = ("linear", "weight_left", *(f"blocks{c}" for c in BLOCKS), "native", "native16", "packed", "pairs",
           "pairs16")


@dataclass(frozen=True)
class RuntimeSettings:
    # products the load-time timing may pick among (F.linear, "linear", is always kept: the fallback of every other)
    kernels: tuple[str, ...] = KERNELS
    # the chosen kernel for 9-64 rows (tree verification) timed like the others; off = F.linear there
    tree_kernel: bool = True
    # decode, verification and drafting attend over the KV cache with runtime/native.py's kernel where it is usable
    # (float32 on a CPU with its vector loops built); off = torch's attention
    native_attention: bool = True
    # the target's decode and verification pass as one native.decoder_step call where it can run (float32 on a CPU,
    # native attention on); off = its compiled `forward`
    native_pass: bool = True
    # torch.compile the passes before timing (inductor, needs a C++ compiler); off = eager
    compile: bool = True

    def __post_init__(self) -> None:
        unknown = set(self.kernels) - set(KERNELS)
        if unknown:
            raise ValueError(f"unknown kernel(s) {', '.join(sorted(unknown))}; known: {', '.join(KERNELS)}")
        if "linear" not in self.kernels:
            object.__setattr__(self, "kernels", ("linear", *self.kernels))

    def without(self, names: set[str] | list[str]) -> RuntimeSettings:
        """These settings with the named kernels left out of the choice."""
        return replace(self, kernels=tuple(k for k in self.kernels if k not in set(names)))

    @property
    def uses_native_pass(self) -> bool:
        """The native pass is native attention inside one call: it runs only where both are on."""
        return self.native_pass and self.native_attention


DEFAULT = RuntimeSettings()
