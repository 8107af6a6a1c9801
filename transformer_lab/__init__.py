"""Transformer Math Lab: the components of a Transformer, one chapter of mathematics each.

| chapter | field              | modules                                      |
|---------|--------------------|----------------------------------------------|
| 1       | linear algebra     | attention                                    |
| 2       | probability        | softmax, sampling                            |
| 3       | optimization       | optim, regularization                        |
| 4       | calculus           | backprop, mlp                                |
| 5       | information theory | information                                  |
| 6       | combinatorics      | positional                                   |
| 7       | numerical analysis | norm, numerics, residual                     |
| 8       | the mini-GPT       | gpt, reference, data, train, distributed, checkpoint, ladder, lens, cli |

Cross-cutting: ``fast`` (the mini-GPT's speed paths, explained on the back-matter page "Making the mini-GPT
fast"), ``derivations`` (SymPy, one module per chapter), ``exercises`` (automatic checks, one module per chapter),
``grading`` (a submission graded in its own process), ``course`` (the nbgrader export), ``viz`` (plot style and
interactive figures). Import submodules directly, e.g.
``from transformer_lab.attention import scaled_dot_product_attention``.
"""

__version__ = "0.1.0"
