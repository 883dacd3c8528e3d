"""Compile a kernel of ``vla_verify.backends.triton_fused_kernels`` (or of
``triton_chunk_gate_kernels``) for the H200 (sm_90) on a
machine WITHOUT a GPU and count what its token loop costs: instructions, barriers, spills.

    python benchmarks/gpu/offline_sass.py vla_gate_kernel 64,2,PIPELINE=1,SPLIT=4,HAS_INIT=1

Each argument is ``BK,num_warps[,NAME=VALUE...]`` (constexpr values, and ``maxnreg``, the
launch option that caps registers per thread; the pointer inputs q, k, v,
u, o are bf16, every other pointer float32, ``ACC`` float32, ``DOWNDATE`` fma).  Integer
arguments are marked divisible by 16 as the launcher specialises them (``--no-div16`` to
drop that): without it the compile does not reproduce what ran on the H200 — the split gate
loop after a tile load compiled to 5218 instructions per token, 32 registers and 3204 spill
instructions only *with* the specialisation (the 20-50x slowdown measured in
``benchmarks/results/h200/two_pass_sweeps/run5_c26525f.json``).  Use the Triton version of the
GPU machine (3.6.0 in 2026-11: ``pip download --no-deps triton==3.6.0`` into a venv): the
local 3.9 compiled the same source without the pathology.

Printed per configuration: ``instr`` (instructions in the longest loop, one token), ``bar``
(``BAR`` instructions), ``spill`` (``STL``/``LDL`` in the loop), ``regs`` (registers per
thread, from cuobjdump), ``cpath`` (a rough critical path in cycles through register
dependencies, with barriers as full fences; a ranking aid, not a prediction).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

_MODULES = (
    "vla_verify.backends.triton_fused_kernels",
    "vla_verify.backends.triton_chunk_gate_kernels",
)
BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
#: Constexprs given a default here (a constexpr left out would be compiled as a runtime i32
#: argument, both branches of every `if` on it: the session-4/5 BK = 128 spill counts were that).
_DEFAULT_FLAGS = {"PIPELINE": 1, "SPLIT": 4, "BLOCK_T": 8, "NUDGE_BRANCH": 0, "LOAD_PLAIN": 0,
                  "KEY_AHEAD": 0, "PERIOD_LOOP": 0}  # fmt: skip
_INTS = ("T", "H", "DK", "DV", "CK", "NC", "t_begin", "n_steps", "BH", "NV")
#: Latencies (cycles) of the critical-path estimate; others count 6.
_LATENCY = {"FADD": 4, "FMUL": 4, "FFMA": 4, "FMNMX": 4, "FSEL": 4, "LDS": 30, "SHFL": 28,
            "MUFU": 22, "STS": 20, "LDG": 0, "STG": 1, "IMAD": 4, "LOP3": 4, "IADD3": 4,
            "FCHK": 8, "BAR": 24, "ISETP": 4, "FSETP": 4}  # fmt: skip


def compile_kernel(
    name: str, bk: int, num_warps: int, consts: dict[str, int], div16: bool, maxnreg: int | None
):
    fn = None
    for module in _MODULES:
        fn = getattr(importlib.import_module(module), name, fn)
    assert fn is not None, f"no kernel {name} in {_MODULES}"
    sig: dict[str, str] = {}
    fixed: dict[str, object] = {}
    for arg in fn.arg_names:
        if arg in consts:
            fixed[arg] = consts[arg]
        elif arg == "BK":
            fixed[arg] = bk
        elif arg == "BV":
            fixed[arg] = 64
        elif arg == "ACC":
            fixed[arg] = tl.float32
        elif arg in ("HAS_INIT", "SAVE_CKPT", "SAVE_CHAIN", "BUG"):
            fixed[arg] = 0
        elif arg in ("NORM_GATE", "NORM_OUT", "DOWNDATE"):
            fixed[arg] = 1
        elif arg in ("ascr_ptr", "wscr_ptr"):  # the chunked gate's float64 scratch
            sig[arg] = "*fp64"
        elif arg in ("ticket_ptr", "progress_ptr"):  # the streamed forward's counters
            sig[arg] = "*i32"
        elif arg in _DEFAULT_FLAGS:  # every constexpr of the gate pass: never a runtime i32
            fixed[arg] = _DEFAULT_FLAGS[arg]
        elif arg.endswith("_ptr"):
            sig[arg] = "*bf16" if arg[0] in "qkvuo" and arg[1] == "_" else "*fp32"
        else:
            sig[arg] = "i32"
    sig.update({arg: "constexpr" for arg in fixed})
    attrs = {}
    if div16:
        for arg in fn.arg_names:
            if arg not in fixed and (arg.endswith("_ptr") or arg in _INTS):
                attrs[(fn.arg_names.index(arg),)] = [["tt.divisibility", 16]]
    src = ASTSource(
        fn=fn,
        signature=sig,
        constexprs={(fn.arg_names.index(a),): v for a, v in fixed.items()},
        attrs=attrs,
    )
    options: dict[str, int] = {"num_warps": num_warps}
    if maxnreg is not None:
        options["maxnreg"] = maxnreg
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def loop_body(sass: str) -> list[str]:
    """The instructions of the longest loop (label to its backward branch)."""
    body: list[str] = []
    labels: dict[str, int] = {}
    for line in sass.splitlines():
        m = re.match(r"^\.L_x_(\d+):", line)
        if m:
            labels[m.group(1)] = len(body)
        elif re.match(r"\s+/\*[0-9a-f]{4,}\*/", line):
            body.append(line)
    loops = []
    for i, line in enumerate(body):
        m = re.search(r"BRA\s+`?\(\.L_x_(\d+)\)", line)
        if m and m.group(1) in labels and labels[m.group(1)] <= i:
            loops.append((labels[m.group(1)], i))
    if not loops:
        return []
    start, end = max(loops, key=lambda se: se[1] - se[0])
    return body[start : end + 1]


def critical_path(lines: list[str]) -> int:
    ready: dict[str, int] = {}
    fence = worst = 0
    for line in lines:
        m = re.search(r"\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_]+)(\.[A-Z0-9_.]+)?\s*(.*?);", line)
        if not m or m.group(2) in ("BRA", "BSSY", "BSYNC", "CALL", "NOP", "EXIT"):
            continue
        op, args = m.group(2), m.group(4)
        regs = re.findall(r"\b(U?R\d+|U?P\d)\b", args)
        if op == "BAR":
            fence = worst = max(worst, fence) + _LATENCY["BAR"]
            continue
        no_dest = op.startswith(("ST", "RED", "ATOM"))
        dests, srcs = ([], regs) if no_dest else (regs[:1], regs[1:])
        start = max([ready.get(r, 0) for r in srcs] + [fence])
        for r in dests:
            ready[r] = start + _LATENCY.get(op, 6)
        worst = max(worst, start + _LATENCY.get(op, 6))
    return worst


def report(kernel, tag: str) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        sass = subprocess.run(
            [str(BIN / "nvdisasm"), "-c", str(cubin)], capture_output=True, text=True
        ).stdout
        usage = subprocess.run(
            [str(BIN / "cuobjdump"), "-res-usage", str(cubin)], capture_output=True, text=True
        ).stdout
    body = loop_body(sass)
    regs = re.search(r"REG:(\d+)", usage)
    return {
        "config": tag,
        "instr": len(body),
        "bar": sum("BAR" in line for line in body),
        "spill": sum(bool(re.search(r"\b(STL|LDL)\b", line)) for line in body),
        "regs": int(regs.group(1)) if regs else None,
        "cpath": critical_path(body),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kernel", help="e.g. vla_gate_kernel, vla_state_kernel, vla_fwd_kernel")
    ap.add_argument("configs", nargs="+", help="BK,num_warps[,NAME=VALUE...]")
    ap.add_argument("--no-div16", action="store_true", help="no divisibility specialisation")
    args = ap.parse_args()
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    print(f"triton {triton.__version__}, sm_90", flush=True)
    for cfg in args.configs:
        bk, nw, *rest = cfg.split(",")
        consts = {k: int(v) for k, v in (kv.split("=") for kv in rest)}
        maxnreg = consts.pop("maxnreg", None)  # a launch option, not a constexpr
        kernel = compile_kernel(args.kernel, int(bk), int(nw), consts, not args.no_div16, maxnreg)
        print(report(kernel, cfg), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
