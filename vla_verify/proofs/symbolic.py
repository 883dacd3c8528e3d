"""Symbolic proofs (sympy) of the identities behind claims C1, C3 and C4 of spec §3.

Each ``prove_*`` function builds both sides of an identity from sympy symbols, lets sympy
decide it (``sympy.expand``/``sympy.simplify`` of the difference is zero, a ``solveset`` result
equals the expected set), and returns a :class:`Proof` whose ``established`` is the conjunction
of those computed decisions — no verdict is typed in.  ``derivation`` records each step and for
which dimensions it was proved.

Dimensions.  Identities are proved with fully symbolic entries at small sizes (``d = 1, 2, 3``);
where the argument is dimension-free (only the scalars ``uᵀAu``, ``aᵀb`` enter), the
``derivation`` says why the small sizes suffice.

- :func:`prove_sherman_morrison` — C1: ``(A^{-1} + u uᵀ)^{-1} = A − A u uᵀ A/(1 + uᵀAu)``, and
  the residual when the floor replaces the denominator.
- :func:`prove_rank_one_singular_values` — C4: the singular values of ``I − a bᵀ`` for unit
  ``a, b`` with ``c = aᵀb``: 1 (multiplicity ``d − 2``) and ``σ±² = (3 − 2c ± sqrt(5 − 4c))/2``;
  ``||I − a bᵀ||₂ = 1`` iff ``c = 1``; ``< φ`` (golden ratio) for ``c > 0``.
- :func:`prove_argmin_closed_form` — C3: the objective's stationary point is
  ``(Σ v k̂ᵀ)(Σ k̂k̂ᵀ + M)^{-1}`` (the objective is strictly convex).
- :func:`prove_rls_recursion` — spec §2.4: the rank-2 recursion of the ``rls`` branch of
  ``numpy_oracle.py`` equals that closed form.
- :func:`prove_vla_step_objective` — C3 for ``vla``: the step is **not** the argmin of the C3
  objective, and is exactly the argmin of the per-step objective
  ``β_t||v_t − S k̂_t||² + tr((S − S_{t-1}) M_t (S − S_{t-1})ᵀ)``, ``β_t = 1/(n_t − g_t)``,
  ``n_t = ||A_t k̂_t||`` (the gate's normaliser), ``g_t = k̂_tᵀA_t k̂_t``, when ``n_t > g_t``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import sympy as sp

__all__ = [
    "ALL_PROOFS",
    "Proof",
    "prove_argmin_closed_form",
    "prove_rank_one_singular_values",
    "prove_rls_recursion",
    "prove_sherman_morrison",
    "prove_vla_step_objective",
    "run_all",
]


@dataclass(frozen=True)
class Proof:
    """A computed proof: ``established`` is the conjunction of sympy's decisions in ``steps``."""

    name: str
    statement: str
    established: bool
    derivation: str
    claim: str = ""
    dims: tuple[int, ...] = ()
    steps: tuple[tuple[str, bool], ...] = field(default=(), compare=False)
    seconds: float = field(default=0.0, compare=False)


class _Steps:
    """Collects ``(description, decided)`` pairs and the text of a derivation."""

    def __init__(self) -> None:
        self.steps: list[tuple[str, bool]] = []
        self.lines: list[str] = []
        self.t0 = time.perf_counter()

    def check(self, description: str, decided: bool) -> bool:
        decided = bool(decided)
        self.steps.append((description, decided))
        self.lines.append(f"[{'proved' if decided else 'NOT proved'}] {description}")
        return decided

    def note(self, text: str) -> None:
        self.lines.append(text)

    def proof(self, name: str, statement: str, claim: str, dims: tuple[int, ...]) -> Proof:
        established = bool(self.steps) and all(ok for _, ok in self.steps)
        return Proof(
            name,
            statement,
            established,
            "\n".join(self.lines),
            claim,
            dims,
            tuple(self.steps),
            time.perf_counter() - self.t0,
        )


def _is_zero(expr: sp.Expr | sp.MatrixBase, *, simplify: bool = False) -> bool:
    """Whether sympy reduces ``expr`` (a scalar or a matrix) to exactly zero."""
    reduce = sp.simplify if simplify else sp.expand
    if isinstance(expr, sp.MatrixBase):
        return all(reduce(e) == 0 for e in expr)
    return reduce(expr) == 0


def _sym_matrix(name: str, d: int) -> sp.Matrix:
    """A symmetric ``d×d`` matrix of free real symbols ``name_ij`` (i <= j)."""
    return sp.Matrix(d, d, lambda i, j: sp.Symbol(f"{name}{min(i, j)}{max(i, j)}", real=True))


def _vec(name: str, d: int) -> sp.Matrix:
    return sp.Matrix(d, 1, lambda i, _: sp.Symbol(f"{name}{i}", real=True))


def _mat(name: str, rows: int, cols: int) -> sp.Matrix:
    return sp.Matrix(rows, cols, lambda i, j: sp.Symbol(f"{name}{i}{j}", real=True))


# -- C1 ----------------------------------------------------------------------------------------


def prove_sherman_morrison(dims: tuple[int, ...] = (1, 2, 3)) -> Proof:
    """C1 (spec §3, §2.3): one downdate ``A − s sᵀ/δ`` (``s = A u``, ``δ = 1 + uᵀAu``) is the
    inverse of ``A^{-1} + u uᵀ``; with any other ``δ`` (the floor ``sm_floor``) the residual is
    ``s sᵀ·(δ − 1 − uᵀAu)/δ`` times ``(I + u uᵀA)``-side terms, i.e. nonzero whenever ``s ≠ 0``.

    Proved for symmetric ``A`` with free entries at each ``d`` in ``dims``: the polynomial
    identity ``(A − s sᵀ/δ)(I + u uᵀA) = A + s sᵀ·(1 − (1 + uᵀAu)/δ)`` with ``δ`` a free symbol
    (multiply on the left by ``A^{-1}`` to read it as an inverse when ``A`` is invertible).  The
    identity involves ``u`` and ``A`` only through ``s = Au`` and the scalar ``uᵀAu``, so its form
    does not depend on ``d``; induction over ``t`` then gives ``A_t = (lambda0·I + Σ u uᵀ)^{-1}``.
    """
    st = _Steps()
    delta = sp.Symbol("delta", positive=True)
    for d in dims:
        A = _sym_matrix("a", d)
        u = _vec("u", d)
        s = A * u
        g = (u.T * A * u)[0, 0]
        lhs = (A - s * s.T / delta) * (sp.eye(d) + u * u.T * A)
        rhs = A + s * s.T * (1 - (1 + g) / delta)
        st.check(
            f"d={d}: (A − ssᵀ/δ)(I + uuᵀA) = A + ssᵀ(1 − (1+uᵀAu)/δ) for free δ "
            "(expand of the difference, times δ, is 0)",
            _is_zero((lhs - rhs) * delta),
        )
        exact = lhs.subs(delta, 1 + g)
        st.check(
            f"d={d}: with δ = 1 + uᵀAu, (A − ssᵀ/δ)(I + uuᵀA) = A exactly (simplify)",
            _is_zero(exact - A, simplify=True),
        )
        if d <= 2:
            M = _sym_matrix("m", d)
            Minv = M.inv()
            sm = Minv - Minv * u * u.T * Minv / (1 + (u.T * Minv * u)[0, 0])
            st.check(
                f"d={d}: (M + uuᵀ)^{{-1}} = M^{{-1}} − M^{{-1}}uuᵀM^{{-1}}/(1 + uᵀM^{{-1}}u) "
                "for symmetric M with free entries (simplify)",
                _is_zero((M + u * u.T).inv() - sm, simplify=True),
            )
    st.note(
        "Hence, without nudges and with the floor inactive (δ_t = 1 + u_tᵀA_{t-1}u_t), "
        "A_t = (A_{t-1}^{-1} + u_t u_tᵀ)^{-1} and by induction A_t = (lambda0·I + Σ_{s≤t} u_s "
        "u_sᵀ)^{-1}.  When the floor acts (δ = sm_floor ≠ 1 + uᵀAu) the downdate is off by "
        "s sᵀ(1 − (1+uᵀAu)/δ) — C1 holds only if the floor never acts (always true from an SPD "
        "A_0, where 1 + uᵀAu >= 1 > sm_floor)."
    )
    return st.proof(
        "sherman_morrison",
        "(A^{-1} + u uᵀ)^{-1} = A − A u uᵀ A / (1 + uᵀ A u)  (C1)",
        "C1",
        tuple(dims),
    )


# -- C4 ----------------------------------------------------------------------------------------


def prove_rank_one_singular_values() -> Proof:
    """C4 (spec §3): singular values of ``X = I − a bᵀ`` for unit ``a, b``, ``c = aᵀb``.

    Reduction (all ``d >= 2``): in an orthonormal basis whose first two vectors span
    ``{a, b}`` — ``a = e₁``, ``b = c e₁ + s e₂`` with ``s = sqrt(1 − c²)`` — ``X`` is the block
    ``[[1 − c, −s], [0, 1]]`` plus the identity on the other ``d − 2`` directions, and an
    orthogonal change of basis keeps singular values.  So it suffices to compute the 2×2 block
    symbolically in ``c`` (done here), and it is cross-checked on explicit ``d = 2, 3`` vectors
    with free angles.  The VLA step matrix is ``X_t = I − k̂_t α̂_tᵀ`` with
    ``c_t = α̂_tᵀk̂_t = k̂ᵀAk̂/||Ak̂|| ∈ (0, 1]`` for SPD ``A``.
    """
    st = _Steps()
    c = sp.Symbol("c", real=True)
    lam = sp.Symbol("lambda")
    s = sp.sqrt(1 - c**2)
    block = sp.Matrix([[1 - c, -s], [0, 1]])
    charpoly = (block.T * block - lam * sp.eye(2)).det()
    expected_poly = lam**2 - (3 - 2 * c) * lam + (1 - c) ** 2
    st.check(
        "2×2 block: det(XᵀX − λI) = λ² − (3 − 2c)λ + (1 − c)²",
        _is_zero(charpoly - expected_poly, simplify=True),
    )
    sig_p = (3 - 2 * c + sp.sqrt(5 - 4 * c)) / 2
    sig_m = (3 - 2 * c - sp.sqrt(5 - 4 * c)) / 2
    roots = sp.solve(sp.Eq(expected_poly, 0), lam)
    st.check(
        "its roots are σ±² = (3 − 2c ± sqrt(5 − 4c))/2",
        len(roots) == 2
        and {sp.simplify(r - sig_p) == 0 or sp.simplify(r - sig_m) == 0 for r in roots} == {True},
    )
    th, ph = sp.symbols("theta phi", real=True)
    for d in (2, 3):
        a = sp.Matrix([1] + [0] * (d - 1))
        if d == 2:
            b = sp.Matrix([sp.cos(th), sp.sin(th)])
        else:
            b = sp.Matrix([sp.cos(th), sp.sin(th) * sp.cos(ph), sp.sin(th) * sp.sin(ph)])
        X = sp.eye(d) - a * b.T
        cp = (X.T * X - lam * sp.eye(d)).det()
        want = (lam - 1) ** (d - 2) * expected_poly.subs(c, sp.cos(th)) * (-1) ** d
        st.check(
            f"d={d}, a = e₁, b on the unit sphere (free angles): det(XᵀX − λI) = "
            f"(λ − 1)^{d - 2}·(λ² − (3 − 2c)λ + (1 − c)²), c = cos θ",
            _is_zero(sp.expand_trig(sp.expand(cp - want)), simplify=True),
        )
    one = sp.solveset(sp.Eq(sig_p, 1), c, sp.Interval(-1, 1))
    st.check("σ₊² = 1 on c ∈ [−1, 1] exactly at c = 1 (solveset gives {1})", one == sp.FiniteSet(1))
    deriv = sp.diff(sig_p, c)
    st.check(
        "dσ₊²/dc = −1 − 1/sqrt(5 − 4c) < 0: σ₊ decreases on [−1, 1)",
        _is_zero(deriv - (-1 - 1 / sp.sqrt(5 - 4 * c)), simplify=True),
    )
    phi = (1 + sp.sqrt(5)) / 2
    st.check(
        "σ₊²(c = 0) = φ² with φ = (1 + √5)/2", _is_zero(sig_p.subs(c, 0) - phi**2, simplify=True)
    )
    st.check("σ₊²(c = −1) = 4 (norm 2: a = −b)", _is_zero(sig_p.subs(c, -1) - 4, simplify=True))
    st.note(
        "So for unit k̂_t, α̂_t: ||J_t||₂ = ||I − k̂ α̂ᵀ||₂ = sqrt((3 − 2c + sqrt(5 − 4c))/2) with "
        "c = α̂ᵀk̂; it equals 1 iff c = 1 (α̂ = k̂, i.e. A_t k̂_t ∥ k̂_t), and for c ∈ (0, 1] "
        "(SPD A_t) it lies in [1, φ), φ = 1.618… .  C4's 'exactly 1 for all t' is false in "
        "general; the per-step norm is at most the golden ratio.  (d = 1: X = 1 − c, norm |1 − c|.)"
    )
    return st.proof(
        "rank_one_singular_values",
        "σ(I − a bᵀ) = {1 (×(d−2)), sqrt((3 − 2c ± sqrt(5 − 4c))/2)}, c = aᵀb; ||·||₂ = 1 iff "
        "c = 1  (C4)",
        "C4",
        (2, 3),
    )


# -- C3 ----------------------------------------------------------------------------------------


def prove_argmin_closed_form(dk: int = 2, dv: int = 1, T: int = 2) -> Proof:
    """C3 (spec §3): ``F(S) = Σ_{s≤T} ||v_s − S k_s||² + tr(S M Sᵀ)`` is stationary at
    ``S* = (Σ v_s k_sᵀ)(Σ k_s k_sᵀ + M)^{-1}`` and strictly convex for SPD ``M``.

    Proved with free entries at ``dk``, ``dv``, ``T`` (default 2, 1, 2): the gradient
    ``∂F/∂S = −2 Σ (v_s − S k_s) k_sᵀ + 2 S M`` (computed by sympy from ``F``) vanishes at ``S*``;
    the Hessian is ``2 (Σ k kᵀ + M) ⊗ I``, positive definite when ``M`` is.  The gradient's form
    is the same for every size (it is linear in ``S``), so the small size is representative.
    """
    st = _Steps()
    M = _sym_matrix("m", dk)
    S = _mat("S", dv, dk)
    ks = [_vec(f"k{t}_", dk) for t in range(T)]
    vs = [_vec(f"v{t}_", dv) for t in range(T)]
    F = (
        sum(((v - S * k).T * (v - S * k))[0, 0] for k, v in zip(ks, vs, strict=True))
        + (S * M * S.T).trace()
    )
    grad = sp.Matrix(dv, dk, lambda i, j: sp.diff(F, S[i, j]))
    G = M + sum((k * k.T for k in ks), sp.zeros(dk, dk))
    C = sum((v * k.T for k, v in zip(ks, vs, strict=True)), sp.zeros(dv, dk))
    grad_formula = -2 * C + 2 * S * G
    st.check(
        f"dk={dk}, dv={dv}, T={T}: ∂F/∂S = 2(S G − C), G = Σkkᵀ + M, C = Σvkᵀ",
        _is_zero(grad - grad_formula),
    )
    S_star_times_det = C * G.adjugate()  # S* = C G^{-1} = C adj(G)/det(G)
    st.check(
        "the gradient vanishes at S* = C G^{-1}: det(G)·(S* G − C) = C adj(G) G − det(G) C = 0 "
        "(expand)",
        _is_zero(S_star_times_det * G - G.det() * C),
    )
    hess = sp.hessian(F, list(S))
    st.check(
        "Hessian = 2·(G ⊗ I_dv) (in the row-major order of S's entries)",
        _is_zero(hess - 2 * sp.kronecker_product(sp.eye(dv), G)),
    )
    st.note("G = Σkkᵀ + M is SPD when M is, so F is strictly convex and S* is its unique argmin.")
    return st.proof(
        "argmin_closed_form",
        "argmin_S Σ||v_s − S k̂_s||² + tr(S M Sᵀ) = (Σ v k̂ᵀ)(Σ k̂k̂ᵀ + M)^{-1}  (C3)",
        "C3",
        (dk, dv, T),
    )


def prove_rls_recursion(dims: tuple[int, ...] = (2, 3), dv: int = 2) -> Proof:
    """Spec §2.4 ``rls``: the recursion of ``numpy_oracle.py``'s ``rls`` branch,
    ``P_t = (P_{t-1}^{-1} + k̂k̂ᵀ + uuᵀ)^{-1}`` (two Sherman–Morrison downdates) and
    ``S_t = S_{t-1} + (v − S_{t-1}k̂)(P_t k̂)ᵀ − (S_{t-1}u)(P_t u)ᵀ``, equals the closed form
    ``S_t = C_t P_t`` with ``C_t = C_{t-1} + v k̂ᵀ``, ``C_{t-1} = S_{t-1}P_{t-1}^{-1}``.

    Proved with free entries (``Q = P_{t-1}^{-1}`` symmetric, ``S_{t-1}`` ``dv×dk``, ``k, u, v``)
    at each ``dk`` in ``dims``: ``S_t Q_t = S_{t-1} Q + v kᵀ`` where ``Q_t = Q + kkᵀ + uuᵀ``
    (``P_t = adj(Q_t)/det(Q_t)`` substituted, expand of the difference times ``det Q_t`` is 0);
    and the two downdates equal ``Q_t^{-1}`` (``d = 2``).  With ``S_0 = 0``, ``P_0 = I/lambda0``
    induction gives ``S_t = (Σ v k̂ᵀ)(Σ k̂k̂ᵀ + M_t)^{-1}``, the argmin of C3
    (:func:`prove_argmin_closed_form`) — no unit-norm assumption on ``k̂`` is needed.
    """
    st = _Steps()
    for d in dims:
        Q = _sym_matrix("q", d)
        S = _mat("S", dv, d)
        k, u, v = _vec("k", d), _vec("u", d), _vec("v", dv)
        Qt = Q + k * k.T + u * u.T
        det = Qt.det()
        Pt_adj = Qt.adjugate()  # P_t = Pt_adj / det
        recursive_times_det = S * det + (v - S * k) * (Pt_adj * k).T - (S * u) * (Pt_adj * u).T
        closed = S * Q + v * k.T
        st.check(
            f"dk={d}, dv={dv}: S_t·Q_t = S_(t-1)·Q + v kᵀ for the recursion (expand, times det)",
            _is_zero(recursive_times_det * Qt - closed * det),
        )
    d = 2
    Q = _sym_matrix("q", d)
    k, u = _vec("k", d), _vec("u", d)
    P = Q.inv()

    def downdate(P: sp.Matrix, x: sp.Matrix) -> sp.Matrix:
        s = P * x
        return P - s * s.T / (1 + (x.T * P * x)[0, 0])

    two = downdate(downdate(P, k), u)
    st.check(
        "d=2: SM(SM(P, k̂), u) = (P^{-1} + k̂k̂ᵀ + uuᵀ)^{-1} (simplify)",
        _is_zero(two - (Q + k * k.T + u * u.T).inv(), simplify=True),
    )
    st.note(
        "The rank-2 recursion is exact (no floor acts: 1 + k̂ᵀPk̂ >= 1 and 1 + uᵀPu >= 1 for SPD "
        "P), so rls's S_t is the argmin of C3 for every t."
    )
    return st.proof(
        "rls_recursion",
        "S_t = S_{t-1} + (v − S_{t-1}k̂)(P_t k̂)ᵀ − (S_{t-1}u)(P_t u)ᵀ = (Σ v k̂ᵀ) P_t, "
        "P_t = (Σ k̂k̂ᵀ + M_t)^{-1}  (spec §2.4, C3 for rls)",
        "C3",
        tuple(dims),
    )


def prove_vla_step_objective(dims: tuple[int, ...] = (2, 3), dv: int = 2) -> Proof:
    """C3 for ``vla`` (spec §3, §2.3): what the step minimises.

    1. **Not the C3 argmin.**  At ``t = 1`` from ``S_0 = 0``, ``A_0 = I/lambda0``, ``dk = 1``:
       ``S_1 = v k̂`` (``α̂ = k̂``) but the argmin is ``v k̂/(1 + lambda0 + u²)``; sympy computes the
       difference ``v k̂ (lambda0 + u²)/(1 + lambda0 + u²) ≠ 0``.  For any ``dk`` the first step's
       argmin is ``v (A_1k̂)ᵀ/(1 + g)`` and the step ``v (A_1k̂)ᵀ/n`` (``g = k̂ᵀA_1k̂``,
       ``n = ||A_1k̂||``): equal only if ``n = 1 + g``.
    2. **The objective it does minimise.**  With ``e = v_t − S_{t-1}k̂_t``, ``M_t = A_t^{-1}`` and
       a gate ``α̂ = A_t k̂/n`` for any scale ``n ≠ g`` (``n = ||A_t k̂||`` normalised,
       ``n = 1`` unnormalised), ``D = e α̂ᵀ`` is the stationary point of
       ``β||e − D k̂||² + tr(D M_t Dᵀ)`` with ``β = 1/(n − g)``; proved with free symmetric
       ``A``, free ``k, e, n`` at each ``dk`` in ``dims`` (stationarity ``D(M + βkkᵀ) = βekᵀ``,
       multiplied on the right by ``A``).  By the determinant lemma (proved,
       ``det(M + βkkᵀ) = det M·(1 + β kᵀAk)``) the Hessian ``M + βkkᵀ`` is PD iff
       ``1 + βg = n/(n − g) > 0``: for ``n > 0`` the step is the unique minimiser iff ``n > g``.
       Normalised gates: ``n = ||A k̂|| >= k̂ᵀA k̂ = g`` (Cauchy–Schwarz, Lagrange identity proved
       for ``d = 2, 3``), equality iff ``A k̂ ∥ k̂`` — then ``β = ∞``: the step is the minimum-
       ``tr(D M Dᵀ)`` correction with ``S k̂ = v`` exactly.  Unnormalised gates: a minimiser
       iff ``k̂ᵀA k̂ < 1``, false at the start (``A_0 = I/lambda0``, ``g = 10`` for the preset).
    """
    st = _Steps()
    lam0 = sp.Symbol("lambda0", positive=True)
    u1, v1, kh = sp.symbols("u v khat", real=True)
    # 1. dk = 1, t = 1 (khat = ±1: khat² = 1 substituted)
    A1 = 1 / (lam0 + u1**2)
    gate = (A1 * kh) / sp.Abs(A1 * kh)
    S_vla = v1 * gate
    S_star = v1 * kh / (kh**2 + lam0 + u1**2)
    diff = sp.simplify((S_vla - S_star).subs(kh, 1))
    expected = v1 * (lam0 + u1**2) / (1 + lam0 + u1**2)
    st.check(
        "dk=1, t=1, k̂=1: S_vla − S* = v(λ0 + u²)/(1 + λ0 + u²), nonzero for v ≠ 0 (λ0 > 0) — "
        "vla is not the C3 argmin",
        _is_zero(diff - expected, simplify=True) and sp.simplify(expected.subs(v1, 1)) != 0,
    )
    st.note(f"    S_vla − S* at dk=1, t=1, k̂=1: {diff}")
    n = sp.Symbol("n", real=True)
    for d in dims:
        A = _sym_matrix("a", d)
        k, e = _vec("k", d), _vec("e", dv)
        g = (k.T * A * k)[0, 0]
        beta = 1 / (n - g)
        D = e * (A * k).T / n
        # D (M + β k kᵀ) − β e kᵀ = 0  ⇔ (× A on the right)  D (I + β k kᵀ A) − β e kᵀ A = 0
        stationarity = D * (sp.eye(d) + beta * k * k.T * A) - beta * e * k.T * A
        st.check(
            f"dk={d}, dv={dv}: D = e(Ak)ᵀ/n satisfies D(M + βkkᵀ) = βekᵀ with β = 1/(n − kᵀAk), "
            "for free symmetric A (M = A^{-1}), free k, e and gate scale n",
            _is_zero(sp.together(stationarity * n * (n - g)).applyfunc(sp.numer)),
        )
        M = _sym_matrix("m", d)
        bs = sp.Symbol("beta", real=True)
        lemma = (M + bs * k * k.T).det() * M.det() - M.det() ** 2 * (
            1 + bs * (k.T * M.adjugate() * k)[0, 0] / M.det()
        )
        st.check(
            f"dk={d}: det(M + βkkᵀ) = det M·(1 + β kᵀM^{{-1}}k) (matrix determinant lemma)",
            _is_zero(sp.together(lemma).as_numer_denom()[0]),
        )
        x, y = _vec("x", d), _vec("y", d)
        lagrange = (
            (x.T * x)[0, 0] * (y.T * y)[0, 0]
            - ((x.T * y)[0, 0]) ** 2
            - sum((x[i] * y[j] - x[j] * y[i]) ** 2 for i in range(d) for j in range(i + 1, d))
        )
        st.check(
            f"dk={d}: |x|²|y|² − (xᵀy)² = Σ_(i<j) (x_i y_j − x_j y_i)² >= 0 (Cauchy–Schwarz, "
            "so n = ||Ak̂|| >= k̂ᵀAk̂ = g for unit k̂, with equality iff Ak̂ ∥ k̂)",
            _is_zero(lagrange),
        )
    st.note(
        "Result: S_t = argmin_S β_t||v_t − S k̂_t||² + tr((S − S_{t-1}) M_t (S − S_{t-1})ᵀ), "
        "M_t = A_t^{-1}, β_t = 1/(||A_t k̂_t|| − k̂_tᵀA_t k̂_t) > 0 whenever A_t k̂_t is not "
        "parallel to k̂_t (the hypothesis stated in the brief is confirmed); in the parallel "
        "case the step interpolates (S_t k̂_t = v_t) with the least M_t-weighted change."
    )
    return st.proof(
        "vla_step_objective",
        "vla: S_t = argmin_S β_t||v_t − S k̂_t||² + tr((S − S_{t-1}) M_t (S − S_{t-1})ᵀ), "
        "β_t = 1/(||A_t k̂_t|| − k̂_tᵀA_t k̂_t); not the argmin of the C3 objective  (C3)",
        "C3",
        tuple(dims),
    )


#: Every proof, by name (each a zero-argument callable returning a :class:`Proof`).
ALL_PROOFS: dict[str, Callable[[], Proof]] = {
    "sherman_morrison": prove_sherman_morrison,
    "rank_one_singular_values": prove_rank_one_singular_values,
    "argmin_closed_form": prove_argmin_closed_form,
    "rls_recursion": prove_rls_recursion,
    "vla_step_objective": prove_vla_step_objective,
}


def run_all() -> dict[str, Proof]:
    """Run every proof of :data:`ALL_PROOFS`."""
    return {name: fn() for name, fn in ALL_PROOFS.items()}
