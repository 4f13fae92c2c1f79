from specdec.cli import main

raise SystemExit(main())
