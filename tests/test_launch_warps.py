"""``benchmarks/gpu/launch_warps.py``: its wrapper records the chunked kernel's launches, a
launch with other settings is compared with the backend's outputs and gradients, and a planted
fault (the UT transform's blocks below the diagonal wrong) is rejected, under Triton's
interpreter (where warps do not change the arithmetic)."""

from __future__ import annotations

from script_support import interpreted_chunked_marks, load_script

pytestmark = interpreted_chunked_marks()
lw = load_script("benchmarks/gpu/launch_warps.py")

from vla_verify.backends import triton_chunked_kernels as kernels  # noqa: E402


def test_other_warps_agree_and_launches_are_recorded() -> None:
    out = lw.sweep(40, 96, "cpu", warps=[8], only=["state_prep_kernel"], timing=False,
                   options={"maxnreg": None})  # fmt: skip
    assert {"penalty_chain_kernel", "state_prep_kernel", "state_output_kernel"} <= set(
        out["launches"]
    )
    # The other warps with the options, then the options alone at the backend's warps.
    assert [r["override"] for r in out["variants"]] == [
        {"num_warps": 8, "maxnreg": None},
        {"maxnreg": None},
    ]
    assert all(r["agrees"] for r in out["variants"])
    # The wrappers are gone after the sweep.
    assert not isinstance(kernels.state_prep_kernel, lw._Wrapped)


def test_a_planted_fault_in_one_kernel_is_rejected() -> None:
    partial: list[dict] = []
    planted = {"BUG": kernels.BUG_UT_BLOCK_TERM}
    out = lw.sweep(40, 96, "cpu", warps=[], only=["state_prep_kernel"], timing=False,
                   override=planted, progress=partial.append)  # fmt: skip
    (row,) = out["variants"]
    assert not row["agrees"]
    assert row["relative_difference"]["o"] > 2 * lw.AGREE_RTOL
    assert partial and partial[-1]["variants"] == [row]
