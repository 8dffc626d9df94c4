from stepgap.cli import main

raise SystemExit(main())
