"""`torchdoctor server`: the static checker as a Language Server for editors.

`checking` turns an editor's open document into findings (the same engine and
configuration as `torchdoctor check`), independent of any protocol library;
`lsp` speaks the Language Server Protocol over stdio with pygls.
"""
