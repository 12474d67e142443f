"""Cost formulas only: each function returns a sympy expression (or a number) with its units in
its name."""
