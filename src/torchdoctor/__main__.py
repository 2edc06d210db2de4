from torchdoctor.cli import entry

entry()
