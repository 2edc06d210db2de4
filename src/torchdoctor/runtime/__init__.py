"""The runtime half of torchdoctor: helpers and checks that need torch.

Nothing is imported here on purpose: `torchdoctor.runtime.env_cli` must stay
importable without torch, and `import torchdoctor as td` loads each public name
(`td.pick_device`, `td.to_device`, ...) from its module on first use.
"""
