from specproof.cli import main

raise SystemExit(main())
