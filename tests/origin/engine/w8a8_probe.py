"""Run by ``test_linear.py`` in a subprocess under one ISA cap: does a ``w8a8`` row come out the
same whatever else is computed with it? Prints one JSON object: the checks, the ISA torch picked,
and a digest of every output (equal digests across caps: the same numbers on every CPU)."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import torch

from origin.engine.linear import W8A8Linear

ROWS = (1, 2, 3, 4, 5, 8, 17, 64)


def _normal(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    # numpy's draws: torch.randn's depend on the ISA its kernels were picked for
    return torch.from_numpy(rng.standard_normal(shape, dtype=np.float32) * np.float32(scale))


def main() -> None:
    rng = np.random.default_rng(0)
    digest = hashlib.sha256()
    checks: dict[str, bool] = {}
    # a decoder layer's shapes (the down projection's reduction is split in pieces), a head, a
    # reduction in unequal pieces (2560: 864 + 848 + 848) and one the INT8 kernel cannot take (853)
    shapes = ((960, 576, 8), (576, 1536, 8), (2048, 576, 10), (64, 2560, 8), (64, 853, 8))
    for out_features, in_features, bits in shapes:
        weight = _normal(rng, out_features, in_features, scale=0.05)
        linear = W8A8Linear(weight, None, None, act_bits=bits)
        x = _normal(rng, max(ROWS), in_features, scale=3)
        alone = torch.cat([linear(x[i : i + 1]) for i in range(max(ROWS))])
        name = f"{out_features}x{in_features}/{bits}bit"
        checks[f"{name} row count"] = all(torch.equal(linear(x[:m]), alone[:m]) for m in ROWS)
        order = torch.from_numpy(rng.permutation(max(ROWS)))
        checks[f"{name} row order"] = torch.equal(linear(x[order]), alone[order])
        others = _normal(rng, max(ROWS), in_features, scale=30)
        others[0] = x[0]
        checks[f"{name} other rows"] = torch.equal(linear(others)[0], alone[0])
        digest.update(alone.numpy().tobytes())
    print(
        json.dumps(
            {
                "checks": checks,
                "aten_capability": torch.backends.cpu.get_cpu_capability(),
                "digest": digest.hexdigest(),
            }
        )
    )


if __name__ == "__main__":
    main()
