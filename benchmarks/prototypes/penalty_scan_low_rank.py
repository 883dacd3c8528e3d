"""A faster form of the penalty adjoint's scan, prototyped beside the shipped
``vla_penalty_bwd_scan_kernel`` (not a backend; design doc ``docs/design/triton_chunked.md``,
"Where a training step's time goes"): each piece's ``Q`` in compact WY form (a Triton kernel),
timed beside the backend's scan piece after piece and in groups of pieces
(``RecurrentPlan.penalty_scan_group``, :func:`scan_grouped`).

The shipped scan loads each piece's ``Q = I − Uᵀ M`` (``U`` the piece's penalties, ``M = Tᵀ S``
from its compact WY factor, both ``[n, d]``) as a ``d × d`` tile and forms ``Q Σ Qᵀ`` by two
``d × d × d`` products.  With ``X = M Σ``, ``Z = X Mᵀ`` (symmetric, as ``Σ`` is) and
``R = X − ½ Z U``::

    Q Σ Qᵀ = Σ − Uᵀ X − Xᵀ U + Uᵀ Z U = Σ − (Uᵀ R + Rᵀ U)

so a piece costs ``3 n d² + 2 n² d`` multiply-adds (``X``, ``Z``, ``Z U`` and the two rank-``n``
updates) instead of ``2 d³``, and loads ``U`` and ``M`` (``8 n d`` bytes) instead of ``Q``.

:func:`scan_low_rank` runs it with the shipped kernel's inputs and outputs otherwise (the local
term ``sym(Ãᵀ K̃)`` loaded per piece, ``Σ`` and ``dz`` stored after every piece);
:func:`scan_shipped` runs the shipped kernel on ``Q`` formed from the same ``U`` and ``M``.
``python benchmarks/prototypes/penalty_scan_low_rank.py OUT`` (on a GPU) checks every variant
against a float64 scan and the shipped kernel and times them with ``triton.testing.do_bench``
(B = 1, H = 16, 1024 pieces of 32 rows: the paper preset at T = 16384), writing
``OUT/penalty_scan_low_rank.json``;
``--preflight [JSON]`` builds both for sm_90 without a GPU (:func:`preflight`).  Built so
(Triton 3.6, ``benchmarks/results/sm90/penalty_scan_low_rank_preflight.json``), the two keep
``Σ`` partly on the stack alike at BK = 128 (888 against 872 bytes per thread at 8 warps, one
stage), and at BK = 64 neither spills with one stage; untimed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

#: Planted slip for the meta-tests: the rank-``n`` correction without the ½ on ``Z U``.
BUG_NO_HALF = tl.constexpr(1)


@triton.jit
def scan_low_rank_kernel(
    u_ptr, m_ptr, lm_ptr, dzp_ptr, daT_ptr, dzT_ptr, sig_ptr, dze_ptr, sig0_ptr, dz0_ptr, DK, n_p,
    BK: tl.constexpr, BP: tl.constexpr, ACC: tl.constexpr, BUG: tl.constexpr,
):  # fmt: skip
    """Grid ``(B·H,)``; ``u, m`` ``[B·H, pieces, BP, BK]``, the rest as the shipped scan's."""
    i_bh = tl.program_id(0).to(tl.int64)
    ok = tl.arange(0, BK)
    op = tl.arange(0, BP)
    mk = ok < DK
    m_kk = mk[:, None] & mk[None, :]
    dA = tl.load(daT_ptr + i_bh * DK * DK + ok[:, None] * DK + ok[None, :], mask=m_kk,
                 other=0.0).to(ACC)  # fmt: skip
    sig = 0.5 * (dA + tl.trans(dA))
    dz = tl.load(dzT_ptr + i_bh * DK + ok, mask=mk, other=0.0).to(ACC)
    half = 1.0 if BUG == BUG_NO_HALF else 0.5
    for jp in range(n_p):
        ip = n_p - 1 - jp
        tile = (i_bh * n_p + ip) * BK * BK + ok[:, None] * BK + ok[None, :]
        rows = (i_bh * n_p + ip) * BP * BK + op[:, None] * BK + ok[None, :]
        tl.store(sig_ptr + tile, sig)
        tl.store(dze_ptr + (i_bh * n_p + ip) * BK + ok, dz)
        U = tl.load(u_ptr + rows)
        M = tl.load(m_ptr + rows)
        X = tl.dot(M, sig, input_precision="tf32x3")
        Z = tl.dot(X, tl.trans(M), input_precision="tf32x3")
        R = X - half * tl.dot(Z, U, input_precision="tf32x3")
        upd = tl.dot(tl.trans(U), R, input_precision="tf32x3")
        upd = tl.dot(tl.trans(R), U, acc=upd, input_precision="tf32x3")
        sig = sig - upd + tl.load(lm_ptr + tile)
        dz = dz + tl.load(dzp_ptr + (i_bh * n_p + ip) * BK + ok)
    tl.store(sig0_ptr + i_bh * BK * BK + ok[:, None] * BK + ok[None, :], sig)
    tl.store(dz0_ptr + i_bh * DK + ok, dz, mask=mk)


def make_inputs(
    bh: int, pieces: int, d: int, n: int = 32, *, device: str = "cpu", seed: int = 0
) -> dict[str, torch.Tensor]:
    """Random float32 inputs of one scan: ``U, M`` ``[bh, pieces, n, d]`` scaled so that each
    ``Q`` is near the identity (as the downdates' congruences are), a symmetric local term per
    piece, ``dz`` parts, and the cotangents after the span."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (scale * torch.randn(*shape, generator=g)).to(device)

    lm = rnd(bh, pieces, d, d, scale=0.1)
    return {
        "u": rnd(bh, pieces, n, d, scale=0.3 / d**0.5),
        "m": rnd(bh, pieces, n, d, scale=0.3 / d**0.5),
        "lm": 0.5 * (lm + lm.transpose(-1, -2)),
        "dzp": rnd(bh, pieces, d),
        "daT": rnd(bh, d, d),
        "dzT": rnd(bh, d),
    }


def _outputs(x: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    bh, pieces, _n, d = x["u"].shape
    dev = x["u"].device
    return {
        "sig": torch.empty(bh, pieces, d, d, device=dev),
        "dze": torch.empty(bh, pieces, d, device=dev),
        "sig0": torch.empty(bh, d, d, device=dev),
        "dz0": torch.empty(bh, d, device=dev),
    }


def scan_low_rank(x: dict[str, torch.Tensor], *, bug: int = 0) -> dict[str, torch.Tensor]:
    """The prototype's outputs ``sig, dze, sig0, dz0`` (the shipped scan's layout)."""
    bh, pieces, n, d = x["u"].shape
    out = _outputs(x)
    scan_low_rank_kernel[(bh,)](
        x["u"], x["m"], x["lm"], x["dzp"], x["daT"], x["dzT"], out["sig"], out["dze"],
        out["sig0"], out["dz0"], d, pieces, BK=d, BP=n, ACC=tl.float32, BUG=bug,
        num_warps=8,
    )  # fmt: skip
    return out


def form_q(x: dict[str, torch.Tensor]) -> torch.Tensor:
    """``Q = I − Uᵀ M`` per piece, ``[bh, pieces, d, d]`` (the shipped scan's input)."""
    d = x["u"].shape[-1]
    eye = torch.eye(d, device=x["u"].device)
    return eye - x["u"].transpose(-1, -2) @ x["m"]


def scan_shipped(x: dict[str, torch.Tensor], qm: torch.Tensor) -> dict[str, torch.Tensor]:
    """The backend's scan (``_scan_pieces``, piece after piece) on ``qm`` (:func:`form_q` of
    the same inputs)."""
    return scan_grouped(x, qm, 1)


def scan_grouped(
    x: dict[str, torch.Tensor], qm: torch.Tensor, m: int, *, bug: int = 0
) -> dict[str, torch.Tensor]:
    """The backend's scan in groups of ``m`` pieces (``_scan_pieces``: each group composed into
    one piece, the scan over the groups, each group's inner pieces from its end), ``bug`` the
    backend's planted bug (``Bug.GROUP_ORDER``: a group's ``Q`` composed reversed)."""
    from vla_verify.backends.triton_fused import _scan_pieces

    d = x["u"].shape[-1]
    got = _scan_pieces(qm, x["lm"], x["dzp"], x["daT"], x["dzT"], d, m, bug=bug)
    return dict(zip(("sig", "dze", "sig0", "dz0"), got, strict=True))


def scan_float64(x: dict[str, torch.Tensor]) -> torch.Tensor:
    """``Σ`` before the span in float64 PyTorch, ``Σ ← Q Σ Qᵀ + L`` piece after piece."""
    q = form_q({k: v.double() for k, v in x.items()})
    sig = 0.5 * (x["daT"].double() + x["daT"].double().transpose(-1, -2))
    for ip in reversed(range(q.shape[1])):
        sig = q[:, ip] @ sig @ q[:, ip].transpose(-1, -2) + x["lm"][:, ip].double()
    return sig


def preflight() -> list[dict[str, Any]]:
    """Both scan kernels built for sm_90 without a GPU (as ``benchmarks/preflight_sm90.py``
    builds the shipped kernels, with the launch's alignments): registers and stack per thread
    and shared memory, at BK = 64 and 128, 4 and 8 warps, one and three pipeline stages."""
    import re
    import subprocess
    import tempfile

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from vla_verify.backends.triton_fused_kernels import vla_penalty_bwd_scan_kernel

    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"

    def build(fn: Any, constexprs: dict[str, Any], options: dict[str, int]) -> dict[str, Any]:
        signature: dict[str, str] = {}
        attrs: dict[tuple[int, ...], list[list[Any]]] = {}
        for i, name in enumerate(fn.arg_names):
            if i in fn.constexprs:
                signature[name] = "constexpr"
                continue
            signature[name] = "i32" if name in ("DK", "n_p", "per_group") else "*fp32"
            attrs[(i,)] = [["tt.divisibility", 16]]  # tensors; integers that are multiples of 16
        compiled = triton.compile(
            ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs),
            target=GPUTarget("cuda", 90, 32), options=options,
        )  # fmt: skip
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(compiled.asm["cubin"])
            f.flush()
            usage = subprocess.run([str(cuobjdump), "-res-usage", f.name],
                                   capture_output=True, text=True).stdout  # fmt: skip
        row = {k.lower(): int(m.group(1)) for k in ("REG", "STACK")
               if (m := re.search(rf"{k}:(\d+)", usage))}  # fmt: skip
        return row | {"shared": int(compiled.metadata.shared)}

    rows = []
    for bk in (64, 128):
        for warps in (4, 8):
            for stages in (1, 3):
                options = {"num_warps": warps, "num_stages": stages}
                low = {"BK": bk, "BP": 32, "ACC": tl.float32, "BUG": 0}
                row = {"BK": bk, **options,
                       "low_rank": build(scan_low_rank_kernel, low, options),
                       "shipped": build(vla_penalty_bwd_scan_kernel,
                                        {"BK": bk, "ACC": tl.float32, "FROM_TILES": False},
                                        options)}  # fmt: skip
                rows.append(row)
                print(row, flush=True)
    return rows


def main(
    out_dir: str,
    *,
    device: str = "cuda",
    widths: tuple[int, ...] = (64, 128),
    bh: int = 16,
    pieces: int = 1024,
    timer: Any = None,
) -> dict[str, Any]:
    """On a GPU: every variant's ``Σ`` before the span against the float64 scan and its ``Σ``
    after every piece against the shipped kernel's, then ``do_bench`` medians (``timer``),
    side by side."""
    from vla_verify.bench import machine_info

    if timer is None:
        from triton.testing import do_bench

        def timer(fn: Any) -> float:
            return float(do_bench(fn, warmup=100, rep=500))

    result: dict[str, Any] = {"machine": machine_info(), "records": []}
    for d in widths:
        x = make_inputs(bh, pieces, d, device=device)
        qm = form_q(x)
        ref = scan_float64(x)
        shipped = scan_shipped(x, qm)
        variants: dict[str, Any] = {
            "shipped": lambda x=x, qm=qm: scan_shipped(x, qm),
            "low_rank": lambda x=x: scan_low_rank(x),
        }
        for m in (4, 8, 16, 32):
            variants[f"grouped{m}"] = lambda x=x, qm=qm, m=m: scan_grouped(x, qm, m)
        for name, fn in variants.items():
            got = fn()
            rec = {
                "d": d, "pieces": pieces, "bh": bh, "variant": name,
                "sig0_error_vs_float64": float((got["sig0"].double() - ref).abs().max()
                                               / ref.abs().max()),
                "sig_error_vs_shipped": float((got["sig"] - shipped["sig"]).abs().max()
                                              / shipped["sig"].abs().max()),
                "median_ms": timer(fn),
            }  # fmt: skip
            result["records"].append(rec)
            print(rec, flush=True)
    path = Path(out_dir) / "penalty_scan_low_rank.json"
    path.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    if sys.argv[1:2] == ["--preflight"]:
        rows = preflight()
        if len(sys.argv) > 2:
            Path(sys.argv[2]).write_text(json.dumps(rows, indent=1))
    else:
        main(sys.argv[1] if len(sys.argv) > 1 else ".")
