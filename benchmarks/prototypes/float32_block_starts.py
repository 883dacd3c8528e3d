"""The penalty chain's products-only block starts with the blocks' matrices in float32, for their
precision (not a backend; ``docs/design/triton_chunked.md``, "The floor", further way 6).

``triton_chunked`` starts each block of its penalty chain from ``A = Π Θ^{-1}``, where
``(Π; Θ)`` comes from applying the earlier blocks' ``2dk × 2dk`` matrices to ``(A_0; I)`` one
after the other (:func:`~vla_verify.backends.triton_chunked.penalty_block_starts` with
``normalise=False``), all in float64, and checks each start against the chain's block end to
``BLOCK_START_RTOL``.  For 16-bit inputs float32 matrices would run on tensor cores (tf32x3)
instead of the float64 ones, if the starts stayed accurate enough for the check to pass.  This
module measures that in NumPy: the blocks' matrices formed as the kernel forms them (a piece of
tokens between nudges ``Θ ← Θ + Uᵀ(U Π)``, a nudge ``Π ← Π + ηΘ``), applied block after block,
one solve per start, every operation in float64 or in float32; each start is compared with the
float64 recurrence of spec §2.3 run token by token (largest entry difference over the start's
largest entry, the check's measure).  A third column is the float32 chain's way: the matrices
of the bf16-rounded penalties in float32 with the tensor cores' tf32x3 products
(:func:`tf32x3_dot`, the tf32 rounding emulated bit for bit), applied and solved in float64,
with its ratio to the float32 chain's check tolerance (``block · 2^-24``); and the same with
each piece's term accumulated into ``Θ`` by a truncating accumulator (``tf32x3_into_accumulator``,
:func:`tf32x3_dot_into`), which the kernel avoids.

Penalties: the layer's (``‖u‖² = 1/dk``) in random directions, in one direction and in four;
strong Gaussian ones; the strategies' concentrated ones (magnitudes to 10^2.5).  A planted
fault, the matrices without their nudges, must give starts far off.

``python benchmarks/prototypes/float32_block_starts.py OUT.json`` writes the table for the
forward's block lengths at D = 64 and 128, T = 4096 to 65536 (paper preset, one head, seed 0).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import block_start_spans as spans  # the layer's penalties, as the shipped constant's study

#: (T, dk, tokens per block): the forward's default blocks at B·H = 16.
SETTINGS = ((4096, 64, 256), (16384, 64, 512), (16384, 128, 2048), (65536, 64, 2048),
            (65536, 128, 8192))  # fmt: skip
PENALTIES = ("layer", "layer_one_direction", "layer_four_directions", "gaussian", "concentrated")


def penalties(kind: str, T: int, dk: int, rng: np.random.Generator) -> np.ndarray:
    """``u`` ``[T, dk]`` float64 of the named kind (module docstring)."""
    if kind == "layer":
        return spans.layer_penalties(T, dk, rng=rng)[0].numpy()
    if kind == "layer_one_direction":
        return np.tile(np.eye(dk)[0] / np.sqrt(dk), (T, 1))
    if kind == "layer_four_directions":
        return np.eye(dk)[rng.integers(0, 4, T)] / np.sqrt(dk)
    if kind == "gaussian":
        return rng.standard_normal((T, dk))
    if kind == "concentrated":
        magnitude = 10.0 ** rng.uniform(-1, 2.5, T)
        return np.eye(dk)[rng.integers(0, 2, T)] * magnitude[:, None]
    raise ValueError(f"unknown penalties {kind!r}")


def block_matrices(
    u: np.ndarray, *, period: int, eta: float, block: int, dtype: type, nudges: bool = True
) -> list[np.ndarray]:
    """Every block's matrix but the last's (no start follows it), ``[2dk, 2dk]`` in ``dtype``,
    walked as ``penalty_block_matrix_kernel`` walks it (clock at 0).  ``nudges=False`` plants
    the fault of leaving the nudges out."""
    T, dk = u.shape
    out = []
    for t0 in range(0, T - block, block):
        Pi = np.eye(dk, 2 * dk, dtype=dtype)
        Th = np.eye(dk, 2 * dk, k=dk, dtype=dtype)
        t, t_end = t0, min(T, t0 + block)
        while t < t_end:
            nudge_at = t + (period - t % period)  # a nudge follows token nudge_at - 1
            e = min(nudge_at, t_end)
            U = u[t:e].astype(dtype)
            Th = Th + U.T @ (U @ Pi)
            if e == nudge_at and nudges:
                Pi = Pi + dtype(eta) * Th
            t = e
        out.append(np.vstack([Pi, Th]))
    return out


def _tf32(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to tf32 (10 mantissa bits, to nearest with ties away from zero, as
    ``cvt.rna.tf32.f32``), in float32."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def tf32x3_dot(a: np.ndarray, b: np.ndarray, *, a_exact: bool = False) -> np.ndarray:
    """``a b`` in float32 as the tensor cores' tf32x3 gives it: each operand split into its tf32
    part and the float32 remainder, the remainder rounded to tf32 where it enters a product,
    three products (two where ``a`` is exactly tf32: ``a_exact``), float32 sums."""
    a32, b32 = np.asarray(a, np.float32), np.asarray(b, np.float32)
    a_hi, b_hi = _tf32(a32), _tf32(b32)
    acc = a_hi @ _tf32(b32 - b_hi)
    if not a_exact:
        acc += _tf32(a32 - a_hi) @ b_hi
    return acc + a_hi @ b_hi


def _toward_zero(x: np.ndarray) -> np.ndarray:
    """float64 ``x`` rounded to float32 toward zero."""
    y = x.astype(np.float32)
    over = np.abs(y.astype(np.float64)) > np.abs(x)
    y[over] = np.nextafter(y[over], np.float32(0))
    return y


def tf32x3_dot_into(acc: np.ndarray, a: np.ndarray, b: np.ndarray, *, a_exact: bool) -> np.ndarray:
    """``acc + a b`` with the three (two: ``a_exact``) tf32 products accumulated into ``acc``
    itself, each adding its exact sum with one rounding toward zero: a model of a tensor core
    whose accumulator truncates (not bit for bit; the point is the bias a large ``acc`` takes
    from every truncation)."""
    a32, b32 = np.asarray(a, np.float32), np.asarray(b, np.float32)
    a_hi, b_hi = _tf32(a32), _tf32(b32)
    pairs = [(a_hi, _tf32(b32 - b_hi))] + ([] if a_exact else [(_tf32(a32 - a_hi), b_hi)])
    for x, y in [*pairs, (a_hi, b_hi)]:
        acc = _toward_zero(acc.astype(np.float64) + x.astype(np.float64) @ y.astype(np.float64))
    return acc


def tf32x3_block_matrices(
    u: np.ndarray, *, period: int, eta: float, block: int, u_exact: bool,
    into_accumulator: bool = False,
) -> list[np.ndarray]:  # fmt: skip
    """:func:`block_matrices` in float32 with tf32x3 products (:func:`tf32x3_dot`), as
    ``penalty_block_matrix_kernel`` forms them for the float32 chain; ``u_exact``: the
    penalties are 16-bit values (exact in tf32).  ``into_accumulator``: each piece's term
    accumulated into ``Θ`` inside the tensor cores (:func:`tf32x3_dot_into`) instead of added
    to it after them."""
    T, dk = u.shape
    out = []
    for t0 in range(0, T - block, block):
        Pi = np.eye(dk, 2 * dk, dtype=np.float32)
        Th = np.eye(dk, 2 * dk, k=dk, dtype=np.float32)
        t, t_end = t0, min(T, t0 + block)
        while t < t_end:
            nudge_at = t + (period - t % period)
            e = min(nudge_at, t_end)
            U = u[t:e].astype(np.float32)
            UPi = tf32x3_dot(U, Pi, a_exact=u_exact)
            if into_accumulator:
                Th = tf32x3_dot_into(Th, U.T, UPi, a_exact=u_exact)
            else:
                Th = Th + tf32x3_dot(U.T, UPi, a_exact=u_exact)
            if e == nudge_at:
                Pi = Pi + np.float32(eta) * Th
            t = e
        out.append(np.vstack([Pi, Th]))
    return out


def products_only_starts(matrices: list[np.ndarray], A0: np.ndarray, dtype: type) -> list:
    """``A`` at every block's start after the first: the matrices applied to ``(A_0; I)`` one
    after the other in ``dtype``, each ``Π Θ^{-1}`` by one solve in ``dtype``."""
    dk = A0.shape[0]
    x = np.vstack([A0, np.eye(dk)]).astype(dtype)
    starts = []
    for m in matrices:
        x = m @ x
        with np.errstate(all="ignore"):
            starts.append(np.linalg.solve(x[dk:].T, x[:dk].T).T.astype(np.float64))
    return starts


def recurrence_starts(u: np.ndarray, A0: np.ndarray, *, period: int, eta: float, block: int
                      ) -> list[np.ndarray]:  # fmt: skip
    """``A`` at every block's start after the first by spec §2.3's steps in float64."""
    A = A0.copy()
    starts = []
    for t in range(u.shape[0] - 1):
        s = A @ u[t]
        A = A - np.outer(s, s) / max(1.0 + u[t] @ s, 1e-4)
        if (t + 1) % period == 0:
            A = A + eta * np.eye(A.shape[0])
        if (t + 1) % block == 0:
            starts.append(A.copy())
    return starts


def start_error(got: list[np.ndarray], ref: list[np.ndarray]) -> float:
    """The largest ``max|got − ref| / max|ref|`` over the starts (inf where one is not finite)."""
    worst = 0.0
    for g, r in zip(got, ref, strict=True):
        if not np.isfinite(g).all():
            return float("inf")
        worst = max(worst, float(np.abs(g - r).max() / np.abs(r).max()))
    return worst


def _bf16(u: np.ndarray) -> np.ndarray:
    """``u`` rounded to bfloat16 (to nearest even), in float64."""
    bits = np.asarray(u, dtype=np.float32).view(np.uint32)
    bits = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(
        0xFFFF0000
    )
    return bits.view(np.float32).astype(np.float64)


def study(T: int, dk: int, block: int, kind: str, seed: int = 0) -> dict[str, Any]:
    """One row: the starts' error with float64 and float32 matrices, with the float32 chain's
    tf32x3 matrices applied in float64 (and its ratio to the float32 chain's check tolerance
    ``block · 2^-24``), and the planted fault's."""
    rng = np.random.default_rng(seed)
    u = penalties(kind, T, dk, rng)
    A0 = np.eye(dk) / 0.1
    walk = dict(period=20, eta=1e-3, block=block)
    ref = recurrence_starts(u, A0, **walk)
    row: dict[str, Any] = {"T": T, "dk": dk, "block": block, "penalties": kind}
    with np.errstate(all="ignore"):
        for name, dtype in (("float64", np.float64), ("float32", np.float32)):
            starts = products_only_starts(block_matrices(u, dtype=dtype, **walk), A0, dtype)
            row[name] = start_error(starts, ref)
        # The float32 chain's way: tf32x3 matrices of the bf16-rounded penalties (the chain's
        # inputs), applied and solved in float64, against the recurrence on the same penalties.
        u16 = _bf16(u)
        ref16 = recurrence_starts(u16, A0, **walk)
        m = tf32x3_block_matrices(u16, u_exact=True, **walk)
        row["tf32x3_matrices"] = start_error(products_only_starts(m, A0, np.float64), ref16)
        row["tf32x3_matrices_over_tol"] = row["tf32x3_matrices"] / (block * 2.0**-24)
        m = tf32x3_block_matrices(u16, u_exact=True, into_accumulator=True, **walk)
        row["tf32x3_into_accumulator_over_tol"] = start_error(
            products_only_starts(m, A0, np.float64), ref16
        ) / (block * 2.0**-24)
        planted = block_matrices(u, dtype=np.float64, nudges=False, **walk)
        row["planted_no_nudges"] = start_error(products_only_starts(planted, A0, np.float64),
                                               ref)  # fmt: skip
    return row


def main(path: str) -> None:
    t0 = time.perf_counter()
    rows = []
    for T, dk, block in SETTINGS:
        for kind in PENALTIES:
            rows.append(study(T, dk, block, kind))
            print(json.dumps(rows[-1]), flush=True)
    out = {"command": "python benchmarks/prototypes/float32_block_starts.py OUT.json",
           "settings": {"preset": "paper", "heads": 1, "seed": 0}, "rows": rows,
           "seconds": round(time.perf_counter() - t0, 1)}  # fmt: skip
    with open(path, "w") as f:
        json.dump(out, f, indent=1, allow_nan=True)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
