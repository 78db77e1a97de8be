"""Qlib's expression language evaluated vectorised in torch over a [symbols, bars] panel.

    parse.parse(expr) -> Node                  Qlib's syntax and precedence into an immutable, hashable tree
    evaluate.evaluate(exprs, values, first, last) -> Evaluation   many expressions at once, shared subtrees
    evaluate.lookback(node) / lookahead(node)  bars of history / of future an expression reads
    sets.feature_set(name)                     alpha158, alpha360, label (LABEL0), as Qlib 0.9.7 defines them;
                                               alpha101 (WorldQuant's, alpha101.py: the paper's formulas translated)

Operators (ops.py's table): moments.py (window sums: Sum, Mean, Std, Corr, Slope, ...), rolling.py (whole
windows: Quantile, Rank, IdxMax, Skew, ...; Ref, Delta), smooth.py (EMA); window.py holds the span logic,
infinity.py what a rolling operator does with +-inf (as Qlib's pandas does), fold.py numbers folded within
float range. Cross-sectional operators (CSRank, CSZScore, CSDemean, CSScale, GroupDemean, GroupRank; not Qlib's)
are in cross_section.py, evaluated over every symbol of a day between symbol-block passes by stages.py.
Values match Qlib 0.9.7's D.features cell for cell (tests/features runs Qlib itself).
"""
