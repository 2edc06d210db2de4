from torchdoctor.cli import main

raise SystemExit(main())
