"""Build the Triton kernels that a GPU plan launches for the H200 (sm_90) on a machine without a
GPU, and report what each configuration asks of an SM: shared memory (against the H200's
232448 bytes a block), registers and local-memory spills.

A kernel that does not fit fails only at its first launch on the GPU (``OutOfResources``), and
device time is scarce: this finds it before.  Two steps:

1. **record** (a subprocess under ``TRITON_INTERPRET=1``): one forward and backward of
   ``triton_fused`` and ``triton_chunked``, and one inference forward of ``triton_chunked``, at
   the requested sizes with the plans a 132-SM GPU
   would get (``interpreted`` and the SM count stood in for), every kernel replaced by a recorder
   of its launch (no kernel runs; the numbers are garbage, the launches are what matters);
2. **build**: each distinct launch (kernel, constexprs, argument types, ``num_warps``,
   ``num_stages``) compiled by ``triton.compile`` for ``GPUTarget("cuda", 90, 32)``; shared
   memory from the compiled metadata, registers and spills from ``cuobjdump -res-usage``.

Triton's version decides the code: run it with the version the GPU has (``pip install --target``
a wheel and put it first on ``PYTHONPATH``).  Usage::

    python benchmarks/preflight_sm90.py --sizes 64x16384 128x16384 [--options KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

#: Shared memory a block may use on the H200 (sm_90): 227 KiB.
H200_SHARED_BYTES = 232448
_ROOT = Path(__file__).resolve().parents[1]


def record(
    sizes: list[tuple[int, int]], options: dict[str, Any], out: Path, unsplit: bool = False
) -> None:
    """Step 1, in this process (``TRITON_INTERPRET=1`` set before Triton is imported): write
    every launch of forward + backward at each ``(D, T)`` (B = 1, H = 16, bf16, paper preset)
    to ``out`` as JSON.  ``unsplit``: the chunked adjoints' widest kernels built as at BK ≤ 64
    (one launch, the default pipeline), to see what their builds at BK = 128 avoid."""
    import dataclasses

    import torch

    from vla_verify import VLAConfig
    from vla_verify.backends import triton_chunked as tc
    from vla_verify.backends import triton_fused as tf

    launches: list[dict[str, Any]] = []

    class Recorder:
        def __init__(self, module: str, name: str) -> None:
            self.module, self.name = module, name

        def __getitem__(self, grid: Any) -> Any:
            def launch(*args: Any, **kwargs: Any) -> None:
                def kind(v: Any) -> Any:
                    if isinstance(v, torch.Tensor):
                        return {"tensor": str(v.dtype).removeprefix("torch.")}
                    if isinstance(v, bool):
                        return {"bool": v}
                    if isinstance(v, int):
                        return {"int": v}
                    if isinstance(v, float):
                        return {"float": v}
                    return {"value": str(v)}

                if self.name == "penalty_block_matrix_kernel":
                    # Identity block matrices, so that the block starts solve.
                    m = args[1]
                    m.copy_(torch.eye(m.shape[-1], dtype=m.dtype).expand_as(m))
                # Denominators unfloored, so that the adjoint's paths that check them (the
                # blocks, the pieces) launch their kernels: the gate rerun's, or the chunked
                # forward's kept for the backward (the penalty chain's argument 8).
                if self.name == "vla_gate_kernel":
                    kwargs["cs_ptr"].fill_(1.0)
                if self.name == "penalty_chain_kernel":
                    args[8].fill_(1.0)
                launches.append({"module": self.module, "kernel": self.name,
                                 "args": [kind(a) for a in args],
                                 "kwargs": {k: kind(v) for k, v in kwargs.items()}})  # fmt: skip

            return launch

    kernel_modules = (("triton_fused_kernels", tf.kernels), ("triton_chunked_kernels", tc.kernels))
    for module, mod in kernel_modules:
        for name in dir(mod):
            obj = getattr(mod, name)
            if type(obj).__name__ == "InterpretedFunction" and name.endswith("_kernel"):
                setattr(mod, name, Recorder(module, name))
    # The plans a GPU would get: the interpreter's stand-ins lifted.
    for mod in (tf, tc):
        mod.interpreted = lambda: False  # type: ignore[assignment]
    tf._sm_count = lambda device: 132  # type: ignore[assignment]
    tf._check_run = lambda q, v: None  # type: ignore[assignment]
    if unsplit:
        tf._SPLIT_STATE_CHUNK_ABOVE = tf._PIECES_ONE_STAGE_ABOVE = 1 << 30
        tf._STATE_SCAN_ONE_STAGE_ABOVE = 1 << 30
    base_plan = tf.plan_for

    def plan_for(B: int, H: int, T: int, dk: int, dv: int, dtype: Any, _device: Any,
                 training: bool) -> Any:  # fmt: skip
        plan = base_plan(B, H, T, dk, dv, dtype, torch.device("cuda"), training)
        return dataclasses.replace(plan, **options)

    tf.plan_for = plan_for  # type: ignore[assignment]
    cfg = VLAConfig()
    g = torch.Generator().manual_seed(0)
    for D, T in sizes:
        x = [torch.randn(1, T, 16, D, generator=g).to(torch.bfloat16) for _ in range(4)]
        x[3] = x[3] / D**0.5
        for run in ("fused", "chunked"):
            xs = [a.clone().requires_grad_() for a in x]
            if run == "fused":
                o, _ = tf.fused_recurrent_vla(*xs, config=cfg)
            else:
                o, _ = tc.chunked_vla(*xs, config=cfg)
            torch.autograd.grad(o.float().sum(), xs)
        # The inference forward builds its own kernels (bf16 state-side intermediates, the
        # float32 penalty chain) and, where a caller asks for it, the float64 chain.
        with torch.no_grad():
            for penalty_dtype in ("auto", "float64"):
                tc.chunked_vla(*x, config=cfg, penalty_dtype=penalty_dtype)
    out.write_text(json.dumps(launches))


def _type(v: dict[str, Any]) -> str:
    if "tensor" in v:
        return "*" + {"float32": "fp32", "float64": "fp64", "bfloat16": "bf16",
                      "float16": "fp16", "int32": "i32", "int64": "i64"}[v["tensor"]]  # fmt: skip
    if "bool" in v:
        return "i1"
    if "int" in v:
        return "i64" if abs(v["int"]) >= 2**31 else "i32"
    return "fp32"


def _aligned(v: dict[str, Any]) -> bool:
    """Whether the launch marks the argument divisible by 16, as Triton's JIT does on a GPU:
    every tensor (PyTorch's allocations are aligned far beyond 16 bytes) and every integer that
    is a multiple of 16.  The alignments let the compiler vectorise loads and pipeline them
    through shared memory, so a build without them can under-report a kernel's shared memory."""
    return "tensor" in v or ("int" in v and v["int"] % 16 == 0)


#: Triton's short dtype names (``str(tl.float32) == "fp32"``), for constexpr dtypes.
_DTYPES = {"fp32": "float32", "fp64": "float64", "bf16": "bfloat16", "fp16": "float16"}


def _constexpr(v: dict[str, Any]) -> Any:
    import triton.language as tl

    if "value" in v and v["value"] in _DTYPES:
        return getattr(tl, _DTYPES[v["value"]])
    return next(iter(v.values()))


def launch_source(fn: Any, rec: dict[str, Any]) -> tuple[Any, dict[str, Any], dict[str, int]]:
    """The ``ASTSource`` of one recorded launch of the jit function ``fn`` (its constexprs, the
    argument types and the alignments Triton's JIT gives them on a GPU), its constexprs by name,
    and the launch's options (``num_warps``, ``num_stages``, ``maxnreg``)."""
    from triton.compiler import ASTSource

    values = dict(zip(fn.arg_names, rec["args"], strict=False)) | dict(rec["kwargs"])
    launch = ("num_warps", "num_stages", "maxnreg")
    options = {k: values.pop(k)["int"] for k in launch if k in values}
    constexprs = {}
    signature = {}
    attrs = {}
    for i, name in enumerate(fn.arg_names):
        v = values[name]
        if i in fn.constexprs:
            constexprs[name] = _constexpr(v)
            signature[name] = "constexpr"
        else:
            signature[name] = _type(v)
            if _aligned(v):
                attrs[(i,)] = [["tt.divisibility", 16]]
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return source, constexprs, options


def build(
    launches: list[dict[str, Any]], modules: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Step 2: compile each distinct launch for sm_90; one row per configuration.  A launch's
    ``module`` names where its kernel is: the backend's kernel modules, or ``modules`` (name →
    an object holding the kernel as an attribute, for prototypes)."""
    import triton
    from triton.backends.compiler import GPUTarget

    from vla_verify.backends import triton_chunked_kernels, triton_fused_kernels

    modules = {"triton_fused_kernels": triton_fused_kernels,
               "triton_chunked_kernels": triton_chunked_kernels, **(modules or {})}  # fmt: skip
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    seen: set[str] = set()
    rows = []
    for rec in launches:
        fn = getattr(modules[rec["module"]], rec["kernel"])
        source, constexprs, options = launch_source(fn, rec)
        shown = {k: str(v) for k, v in constexprs.items()}
        key = json.dumps([rec["kernel"], source.signature, shown, options], sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        row: dict[str, Any] = {"kernel": rec["kernel"], "options": options, "constexprs": shown}
        try:
            compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
            row["shared"] = int(compiled.metadata.shared)
            row["fits"] = row["shared"] <= H200_SHARED_BYTES
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(compiled.asm["cubin"])
                f.flush()
                usage = subprocess.run([str(cuobjdump), "-res-usage", f.name],
                                       capture_output=True, text=True).stdout  # fmt: skip
            for field in ("REG", "STACK", "LOCAL"):
                m = re.search(rf"{field}:(\d+)", usage)
                row[field.lower()] = int(m.group(1)) if m else None
        except Exception as exc:
            # A CompilationError names the failing line of the kernel; the reason is the
            # innermost exception of the chain.
            cause: BaseException = exc
            while cause.__cause__ is not None or cause.__context__ is not None:
                cause = cause.__cause__ or cause.__context__  # type: ignore[assignment]
            row["error"] = f"{type(cause).__name__}: {str(cause)[-600:]}"
            row["fits"] = False
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["64x4096", "128x4096"], metavar="DxT")
    ap.add_argument(
        "--options",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="plan fields set on top of the GPU plan, e.g. chunked_penalty_adjoint=1",
    )
    ap.add_argument("--json", type=Path, default=None, help="write the rows here")
    ap.add_argument(
        "--unsplit",
        action="store_true",
        help="build the chunked adjoints' widest kernels at BK = 128 as at BK <= 64",
    )
    ap.add_argument("--record-to", type=Path, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    sizes = [(int(d), int(t)) for d, t in (s.split("x") for s in a.sizes)]
    options = {k: bool(int(v)) if v in ("0", "1") else int(v)
               for k, v in (o.split("=") for o in a.options)}  # fmt: skip
    if a.record_to is not None:
        record(sizes, options, a.record_to, a.unsplit)
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "launches.json"
        env = {**os.environ, "TRITON_INTERPRET": "1"}
        unsplit = ["--unsplit"] if a.unsplit else []
        cmd = [sys.executable, __file__, "--sizes", *a.sizes, "--options", *a.options, *unsplit]
        subprocess.run([*cmd, "--record-to", str(path)], env=env, check=True, cwd=_ROOT)
        launches = json.loads(path.read_text())
    rows = build(launches)
    bad = [r for r in rows if not r["fits"]]
    print(
        f"{len(rows)} configurations, {len(bad)} that do not build or exceed "
        f"{H200_SHARED_BYTES} bytes of shared memory"
    )
    if a.json:
        import triton

        head = {"triton": triton.__version__, "target": "cuda sm_90", "sizes": a.sizes,
                "options": a.options, "unsplit": a.unsplit,
                "shared_limit": H200_SHARED_BYTES}  # fmt: skip
        a.json.write_text(json.dumps({**head, "rows": rows}, indent=1))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
