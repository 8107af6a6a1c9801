"""SymPy derivations, one module per chapter (``ch1`` ... ``ch8``).

Each module's functions return SymPy expressions (the steps a textbook does by hand, ending in the form the code
uses) and its ``check(seed=0)`` lambdifies the results and returns the largest disagreement with
``transformer_lab`` and the PyTorch reference on random inputs, so tests and chapters call the same code.
"""
