"""Explain PyTorch errors: the knowledge base, `td.explain`, `td.diagnose` and `td.install`.

Importing this package (and matching text against the knowledge base) never imports torch.
"""
